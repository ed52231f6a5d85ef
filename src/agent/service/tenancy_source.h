// The administrator's tenancy configuration as the agent reads it (`gpusnap
// agent --tenancy FILE`; tenancy/tenancy.h says what it holds): the file is
// read and parsed again at each use, so a changed ConfigMap is taken up
// without a restart. A file that cannot be read or parsed refuses what needs
// it (fail closed): the error names the file and the member at fault, and the
// log says so once each time the file goes bad. Without a file: the defaults
// (each namespace restores its own snapshots only, and uses no registry).
#pragma once

#include <functional>
#include <string>

#include "gpusnap/status.h"
#include "tenancy/tenancy.h"

namespace gpusnap::agent {

// What ServiceOptions::tenancy asks for. Thread-safe.
std::function<Result<tenancy::TenancyConfig>()> MakeTenancySource(const std::string& path,
                                                                  std::function<void(const std::string&)> log);

}  // namespace gpusnap::agent
