#ifndef MATERIALIZER_CLIENT_CLI_DOCTOR_H_
#define MATERIALIZER_CLIENT_CLI_DOCTOR_H_

// `matctl doctor`: each replica's GPUs as the driver sees them
// (DeviceStats.driver), next to the server's own ledger, with other
// processes holding memory and the defunct or gone ones flagged. Pure
// functions of GetStats answers, so tests feed them made-up ones.

#include <string>
#include <vector>

#include "client/cli/json.h"
#include "client/client.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::client::cli {

// The report as text: per replica, each CUDA device's driver figures, the
// server's share, the ledger and other processes, then the findings (one
// line per defunct or gone process, or per device whose memory is held
// outside the server without a process list). A replica without a GPU
// says so.
std::string RenderDoctor(
    const std::vector<FromReplica<v1::GetStatsResponse>>& replicas);

// The same as JSON: {"replicas": [{"replica", "address", "stats" | "error"}],
// "findings": [...]}.
JsonObject DoctorJson(
    const std::vector<FromReplica<v1::GetStatsResponse>>& replicas);

// The findings alone, e.g. "replica r0 (A): cuda:0: process 17 (python) is
// defunct and still holds 1.00 GiB: ...".
std::vector<std::string> DoctorFindings(
    const std::vector<FromReplica<v1::GetStatsResponse>>& replicas);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_DOCTOR_H_
