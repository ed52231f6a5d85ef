#include "rootfs/diff_plan.h"

#include <algorithm>
#include <set>

namespace gpusnap::rootfs {

namespace {

// What a capture says when entries of `what` are refused.
Status Refused(std::string_view what, const std::vector<std::string>& refused) {
  std::string more =
      refused.size() > 1 ? fmt::format("; {} more entries are refused", refused.size() - 1) : std::string();
  return Status::Error(Code::kFailedPrecondition, "{} cannot be captured: {}{}; exclude what is refused to capture "
                       "the rest",
                       what, refused.front(), more);
}

}  // namespace

std::vector<std::string> OpaqueDirectories(const UpperTree& tree, std::string_view overlay_prefix) {
  std::vector<std::string> out;
  for (const auto& e : tree.entries)
    if (DecideUpperEntry(e, overlay_prefix).disposition == Disposition::kOpaqueDir) out.push_back(e.path);
  return out;
}

Result<DiffPlan> DiffPlanOf(const UpperTree& tree, const PathMatcher& exclusions,
                            const std::map<std::string, std::vector<std::string>>& lower_names,
                            std::string_view overlay_prefix) {
  DiffPlan plan;
  std::set<std::string> deleted;
  std::vector<std::string> refused;
  plan.excluded = tree.excluded;
  for (size_t i = 0; i < tree.entries.size(); ++i) {
    const UpperEntry& e = tree.entries[i];
    const std::string path = ContainerPath(e.path);
    if (exclusions.Excludes(path)) {
      // Only the topmost excluded path is listed: what lies under it follows.
      bool under_listed = std::any_of(plan.excluded.begin(), plan.excluded.end(),
                                      [&](const std::string& x) { return IsAtOrUnder(path, x); });
      if (!under_listed) plan.excluded.push_back(path);
      continue;
    }
    EntryDecision d = DecideUpperEntry(e, overlay_prefix);
    switch (d.disposition) {
      case Disposition::kKeep:
        plan.archived.push_back(i);
        if (e.kind == FileKind::kRegular) plan.archived_bytes += e.size;
        break;
      case Disposition::kWhiteout:
        deleted.insert(path);
        break;
      case Disposition::kOpaqueDir: {
        plan.archived.push_back(i);
        plan.opaque.push_back(path);
        auto lower = lower_names.find(e.path);
        auto upper = tree.children.find(e.path);
        if (lower != lower_names.end())
          for (auto& p : OpaqueDeletions(e.path, upper == tree.children.end() ? std::vector<std::string>{} : upper->second,
                                         lower->second))
            if (!exclusions.Excludes(p)) deleted.insert(std::move(p));
        break;
      }
      case Disposition::kSkip:
        plan.skipped.push_back({path, d.reason});
        break;
      case Disposition::kRefuse:
        refused.push_back(d.reason);
        break;
    }
  }
  if (!refused.empty()) return Refused("the container's writable layer", refused);
  plan.deleted.assign(deleted.begin(), deleted.end());
  return plan;
}

Result<DiffPlan> CachePlanOf(const UpperTree& tree, std::string_view container_root) {
  DiffPlan plan;
  plan.excluded = tree.excluded;
  std::vector<std::string> refused;
  for (size_t i = 0; i < tree.entries.size(); ++i) {
    const UpperEntry& e = tree.entries[i];
    EntryDecision d = DecideCacheEntry(e, container_root);
    if (d.disposition == Disposition::kKeep) {
      plan.archived.push_back(i);
      if (e.kind == FileKind::kRegular) plan.archived_bytes += e.size;
    } else if (d.disposition == Disposition::kSkip) {
      plan.skipped.push_back({ContainerPathIn(container_root, e.path), d.reason});
    } else {
      refused.push_back(d.reason);
    }
  }
  if (!refused.empty()) return Refused(fmt::format("the cache `{}`", container_root), refused);
  return plan;
}

Status CheckFits(uint64_t needed, uint64_t available, uint64_t reserve, std::string_view where) {
  if (available >= reserve && available - reserve >= needed) return Status::Ok();
  return Status::Error(Code::kFailedPrecondition,
                       "the rootfs capture needs {} bytes in `{}`, which has {} free ({} kept in reserve)", needed,
                       where, available, reserve);
}

uint64_t ArchiveBytesBound(const UpperTree& tree, const DiffPlan& plan) {
  constexpr uint64_t kBlock = 512;
  // A ustar header, and a pax extended header (its own header and a block or
  // more of records: long names, xattrs, big sizes) per entry.
  uint64_t total = 2 * kBlock;  // the archive's end
  for (size_t i : plan.archived) {
    const UpperEntry& e = tree.entries[i];
    uint64_t records = 256 + 2 * e.path.size();
    for (const auto& [name, value] : e.xattrs) records += 64 + name.size() + 2 * value.size();
    total += 2 * kBlock + (records + kBlock - 1) / kBlock * kBlock;
    if (e.kind == FileKind::kRegular) total += (e.size + kBlock - 1) / kBlock * kBlock;
  }
  return total;
}

}  // namespace gpusnap::rootfs
