#ifndef MATERIALIZER_SERVER_COMMON_RANDOM_HEX_H_
#define MATERIALIZER_SERVER_COMMON_RANDOM_HEX_H_

#include <string>

namespace materializer {

// 128 bits from the kernel's random source (getrandom), as 32 lowercase hex
// digits: names nobody can guess (handle ids, shared-memory file names).
// Aborts if the kernel has no random source, since no safe name exists then.
std::string UnguessableHex128();

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_RANDOM_HEX_H_
