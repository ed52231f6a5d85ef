#include "rootfs/extract_plan.h"

#include <map>
#include <optional>

namespace gpusnap::rootfs {

namespace {

// The proper ancestors of a clean relative path: "a", "a/b" for "a/b/c".
std::vector<std::string_view> Ancestors(std::string_view path) {
  std::vector<std::string_view> out;
  for (size_t at = path.find('/'); at != std::string_view::npos; at = path.find('/', at + 1))
    out.push_back(path.substr(0, at));
  return out;
}

bool IsDirectory(const ArchiveEntry& e) { return !e.hardlink && e.kind == FileKind::kDirectory; }

// Why an entry of this kind has no place in a rootfs diff, or nothing.
std::optional<std::string> KindRefusal(const ArchiveEntry& e) {
  if (e.hardlink) return std::nullopt;
  switch (e.kind) {
    case FileKind::kRegular:
    case FileKind::kDirectory:
    case FileKind::kSymlink:
      return std::nullopt;
    default:
      return fmt::format("`{}` is a {}: a rootfs diff holds regular files, directories and links only", e.path,
                         FileKindName(e.kind));
  }
}

}  // namespace

Result<std::string> NormalizeArchivePath(std::string_view path) {
  if (path.empty()) return Status::Error(Code::kInvalidArgument, "an entry has an empty path");
  if (path[0] == '/') return Status::Error(Code::kInvalidArgument, "`{}` is an absolute path", path);
  std::string out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    std::string_view part = path.substr(start, slash - start);
    start = slash + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") return Status::Error(Code::kInvalidArgument, "`{}` has a `..` component", path);
    if (!out.empty()) out.push_back('/');
    out.append(part);
  }
  return out;
}

ExtractionPlan PlanExtraction(const std::vector<ArchiveEntry>& entries, const std::vector<std::string>& deleted_paths) {
  ExtractionPlan plan;
  plan.entries = entries;
  const size_t n = entries.size();
  plan.normalized.assign(n, "");
  std::vector<std::optional<std::string>> refusal(n);
  std::vector<bool> valid_path(n, false);
  std::map<std::string, size_t, std::less<>> first_at;  // clean path -> its first entry

  // The paths: clean, once each, of a kind a diff holds.
  for (size_t i = 0; i < n; ++i) {
    const ArchiveEntry& e = entries[i];
    auto clean = NormalizeArchivePath(e.path);
    if (!clean.ok()) {
      refusal[i] = clean.status().message();
      continue;
    }
    plan.normalized[i] = *clean;
    valid_path[i] = true;
    if (auto [it, inserted] = first_at.emplace(*clean, i); !inserted) {
      refusal[i] = fmt::format("`{}` is in the archive twice (entries {} and {})", e.path, it->second + 1, i + 1);
      continue;
    }
    if (auto why = KindRefusal(e)) {
      refusal[i] = *why;
      continue;
    }
    if (clean->empty() && !IsDirectory(e))
      refusal[i] = fmt::format("`{}` would make the root a {}", e.path, e.hardlink ? "hard link" : FileKindName(e.kind));
  }

  // Nothing is written through a link, or under a file, the archive makes.
  for (size_t i = 0; i < n; ++i) {
    if (!valid_path[i] || refusal[i]) continue;
    for (std::string_view ancestor : Ancestors(plan.normalized[i])) {
      auto it = first_at.find(ancestor);
      if (it == first_at.end()) continue;
      const ArchiveEntry& a = entries[it->second];
      if (IsDirectory(a)) continue;
      if (!a.hardlink && a.kind == FileKind::kSymlink)
        refusal[i] = fmt::format("`{}` lies under `{}`, which the archive makes a symbolic link (to `{}`): writing "
                                 "through it could leave the root",
                                 entries[i].path, a.path, a.link_target);
      else
        refusal[i] = fmt::format("`{}` lies under `{}`, which the archive makes a {}, not a directory",
                                 entries[i].path, a.path, a.hardlink ? "hard link" : FileKindName(a.kind));
      break;
    }
  }

  // Hard links: to an earlier entry, accepted, that is no directory.
  for (size_t i = 0; i < n; ++i) {
    const ArchiveEntry& e = entries[i];
    if (!e.hardlink || refusal[i]) continue;
    auto target = NormalizeArchivePath(e.link_target);
    if (!target.ok()) {
      refusal[i] = fmt::format("hard link `{}` points at a path that is refused: {}", e.path, target.status().message());
      continue;
    }
    auto it = first_at.find(*target);
    if (it == first_at.end() || it->second >= i) {
      refusal[i] = fmt::format("hard link `{}` points at `{}`, which no earlier entry of the archive is", e.path,
                               e.link_target);
    } else if (IsDirectory(entries[it->second])) {
      refusal[i] = fmt::format("hard link `{}` points at `{}`, a directory", e.path, e.link_target);
    } else if (refusal[it->second]) {
      refusal[i] = fmt::format("hard link `{}` points at `{}`, which is refused", e.path, e.link_target);
    }
  }

  for (size_t i = 0; i < n; ++i)
    if (refusal[i]) plan.refused.push_back({entries[i].path, *refusal[i]});

  // The order: directories and files, then symbolic links, then hard links.
  for (int phase = 0; phase < 3; ++phase)
    for (size_t i = 0; i < n; ++i) {
      if (refusal[i] || plan.normalized[i].empty()) continue;
      const ArchiveEntry& e = entries[i];
      int p = e.hardlink ? 2 : e.kind == FileKind::kSymlink ? 1 : 0;
      if (p == phase) plan.order.push_back(i);
    }

  // The deletions: container paths, never the root, never through a link
  // the archive makes.
  for (const std::string& d : deleted_paths) {
    std::string_view rel = d;
    while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
    auto clean = NormalizeArchivePath(rel.empty() ? std::string_view(".") : rel);
    if (!clean.ok()) {
      plan.refused.push_back({d, fmt::format("deleted path `{}` has a `..` component", d)});
      continue;
    }
    if (clean->empty()) {
      plan.refused.push_back({d, fmt::format("deleted path `{}` is the root", d)});
      continue;
    }
    std::optional<std::string> why;
    for (std::string_view ancestor : Ancestors(*clean)) {
      auto it = first_at.find(ancestor);
      if (it != first_at.end() && !entries[it->second].hardlink && entries[it->second].kind == FileKind::kSymlink) {
        why = fmt::format("deleted path `{}` lies under `{}`, which the archive makes a symbolic link (to `{}`)", d,
                          entries[it->second].path, entries[it->second].link_target);
        break;
      }
    }
    if (why)
      plan.refused.push_back({d, *why});
    else
      plan.deletions.push_back(*clean);
  }
  return plan;
}

Status PlanStatus(const ExtractionPlan& plan, std::string_view archive_name) {
  if (plan.refused.empty()) return Status::Ok();
  // The first with its reason, the next few by name: enough to find them all in the archive.
  constexpr size_t kNamed = 3;
  std::string more;
  for (size_t i = 1; i < plan.refused.size() && i <= kNamed; ++i)
    more += fmt::format("{}`{}`", i == 1 ? "; also refused: " : ", ", plan.refused[i].entry);
  if (plan.refused.size() > kNamed + 1) more += fmt::format(" and {} more", plan.refused.size() - kNamed - 1);
  return Status::Error(Code::kCorruption, "`{}`: {}{}; nothing was applied", archive_name, plan.refused.front().reason,
                       more);
}

}  // namespace gpusnap::rootfs
