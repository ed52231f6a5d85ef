#include "rootfs/overlay_mount.h"

#include <algorithm>
#include <charconv>

#include "util/split.h"

namespace gpusnap::rootfs {

namespace {

bool IsOctal(char c) { return c >= '0' && c <= '7'; }

Result<int> ParseId(std::string_view field, std::string_view line) {
  int v = 0;
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
  if (ec != std::errc() || end != field.data() + field.size() || field.empty())
    return Status::Error(Code::kInvalidArgument, "mountinfo line `{}`: `{}` is not a mount id", line, field);
  return v;
}

// A legacy lowerdir list (already unescaped from mountinfo's octal): layers
// separated by ':', a literal character after a backslash, and "::" before each
// data-only layer ("/l1:/l2::/d1::/d2"): no regular layer follows a data one.
Status SplitLegacyLowers(std::string_view list, OverlayLayers& out) {
  std::string layer;
  bool data = false;
  auto finish = [&]() -> Status {
    if (layer.empty())
      return Status::Error(Code::kInvalidArgument, "overlay option lowerdir=`{}` has an empty layer", list);
    (data ? out.data_lowers : out.lowers).push_back(std::move(layer));
    layer.clear();
    return Status::Ok();
  };
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == ':') {
      GPUSNAP_RETURN_IF_ERROR(finish());
      bool double_colon = i + 1 < list.size() && list[i + 1] == ':';
      if (double_colon) {
        ++i;
        data = true;
      } else if (data) {
        return Status::Error(Code::kInvalidArgument,
                             "overlay option lowerdir=`{}` has a regular layer after a data-only one", list);
      }
      continue;
    }
    if (c == '\\' && i + 1 < list.size()) c = list[++i];
    layer.push_back(c);
  }
  return finish();
}

}  // namespace

std::string UnescapeMountField(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size() && IsOctal(text[i + 1]) && IsOctal(text[i + 2]) &&
        IsOctal(text[i + 3])) {
      int v = (text[i + 1] - '0') * 64 + (text[i + 2] - '0') * 8 + (text[i + 3] - '0');
      if (v <= 0xff) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

Result<MountInfoEntry> ParseMountInfoLine(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  std::vector<std::string_view> f = Split(line, ' ');
  // At least: id parent dev root mount-point options - fstype source super-options.
  auto dash = std::find(f.begin() + std::min<size_t>(f.size(), 6), f.end(), "-");
  if (f.size() < 10 || dash == f.end() || f.end() - dash != 4)
    return Status::Error(Code::kInvalidArgument, "mountinfo line `{}` does not have the fields of a mount", line);
  MountInfoEntry e;
  GPUSNAP_ASSIGN_OR_RETURN(e.mount_id, ParseId(f[0], line));
  GPUSNAP_ASSIGN_OR_RETURN(e.parent_id, ParseId(f[1], line));
  e.root = UnescapeMountField(f[3]);
  e.mount_point = UnescapeMountField(f[4]);
  e.fstype = UnescapeMountField(dash[1]);
  e.source = UnescapeMountField(dash[2]);
  e.super_options = std::string(dash[3]);
  return e;
}

Result<std::vector<MountInfoEntry>> ParseMountInfo(std::string_view text) {
  std::vector<MountInfoEntry> out;
  size_t number = 0;
  for (std::string_view line : Split(text, '\n')) {
    ++number;
    if (line.empty()) continue;
    auto e = ParseMountInfoLine(line);
    if (!e.ok()) return e.status().Wrap(fmt::format("mountinfo line {}", number));
    out.push_back(std::move(*e));
  }
  return out;
}

Result<OverlayLayers> ParseOverlayOptions(std::string_view super_options) {
  OverlayLayers out;
  bool legacy_lower = false, added_lower = false, seen_upper = false, seen_work = false;
  for (std::string_view option : Split(super_options, ',')) {
    size_t eq = option.find('=');
    std::string_view key = option.substr(0, eq);
    std::string value = eq == std::string_view::npos ? std::string() : UnescapeMountField(option.substr(eq + 1));
    if (key == "lowerdir") {
      if (legacy_lower || added_lower)
        return Status::Error(Code::kInvalidArgument, "overlay options `{}` name the lower layers twice",
                             super_options);
      legacy_lower = true;
      GPUSNAP_RETURN_IF_ERROR(SplitLegacyLowers(value, out));
    } else if (key == "lowerdir+" || key == "datadir+") {
      if (legacy_lower)
        return Status::Error(Code::kInvalidArgument, "overlay options `{}` mix lowerdir= with {}=", super_options,
                             key);
      if (value.empty())
        return Status::Error(Code::kInvalidArgument, "overlay options `{}` have an empty {}=", super_options, key);
      added_lower = true;
      (key == "datadir+" ? out.data_lowers : out.lowers).push_back(std::move(value));
    } else if (key == "upperdir" || key == "workdir") {
      bool& seen = key == "upperdir" ? seen_upper : seen_work;
      if (seen)
        return Status::Error(Code::kInvalidArgument, "overlay options `{}` give {}= twice", super_options, key);
      seen = true;
      (key == "upperdir" ? out.upper : out.work) = std::move(value);
    } else if (key == "userxattr") {
      out.userxattr = true;
    } else if (key == "metacopy") {
      out.metacopy = value == "on";
    } else if (key == "redirect_dir") {
      out.redirect_dir = value == "on";
    } else if (key == "index") {
      out.index = value == "on";
    }
  }
  return out;
}

Result<OverlayLayers> RootOverlay(const std::vector<MountInfoEntry>& mounts) {
  const MountInfoEntry* root = nullptr;
  for (const auto& m : mounts)
    if (m.mount_point == "/") root = &m;
  if (root == nullptr) return Status::Error(Code::kNotFound, "nothing is mounted at the container's root");
  if (root->fstype != "overlay")
    return Status::Error(Code::kFailedPrecondition,
                         "the container's root is a `{}` mount of `{}`, not an overlay: it has no writable layer to "
                         "capture",
                         root->fstype, root->source);
  auto layers = ParseOverlayOptions(root->super_options);
  if (!layers.ok()) return layers.status().Wrap("the container's root overlay");
  if (layers->upper.empty())
    return Status::Error(Code::kFailedPrecondition,
                         "the container's root overlay has no upperdir (a read-only root): nothing to capture");
  return layers;
}

std::vector<std::string> MountPointsBesideRoot(const std::vector<MountInfoEntry>& mounts) {
  std::vector<std::string> out;
  for (const auto& m : mounts)
    if (m.mount_point != "/" && std::find(out.begin(), out.end(), m.mount_point) == out.end())
      out.push_back(m.mount_point);
  return out;
}

}  // namespace gpusnap::rootfs
