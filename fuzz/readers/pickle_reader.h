#ifndef MATERIALIZER_FUZZ_READERS_PICKLE_READER_H_
#define MATERIALIZER_FUZZ_READERS_PICKLE_READER_H_

// Reads the data.pkl of a torch.save archive holding a state_dict, for the
// fuzz targets, which check the writer in server/delivery against it. It
// is the server's own pickle machine (server/checkpoint/pickle.h: never
// runs pickled code), written independently of that writer.
//
//   ASSIGN_OR_RETURN(std::vector<PickledTensor> tensors,
//                    ReadStateDictPickle(data_pkl));

#include "server/checkpoint/pickle.h"

namespace materializer::fuzz {

using checkpoint::PickledTensor;
using checkpoint::ReadStateDictPickle;

}  // namespace materializer::fuzz

#endif  // MATERIALIZER_FUZZ_READERS_PICKLE_READER_H_
