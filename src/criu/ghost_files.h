// The deleted files a CRIU image directory carries ("ghost files"), and where
// a restore of it puts them.
//
// A file the tree holds open after it was unlinked is dumped whole, into
// ghost-file-<id>.img (the id in hex). To restore it, CRIU writes it back to
// <its path when deleted>.cr.<id>.ghost on the filesystem the tree sees,
// opens it for the tree, and removes it before it answers (criu/files-reg.c).
// That name is the images' alone: two restores of one snapshot at once meet
// there, and a CRIU killed between the two steps leaves the file behind.
//
// Read from the images themselves: files.img (or reg-files.img of older
// dumps) for the paths, remap-fpath.img for which of them are ghosts, and
// each ghost-file-<id>.img for its mode, by field number (image_reader.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::criu {

struct GhostFile {
  uint32_t id = 0;
  std::string path;  // absolute, as the tree named the file
  bool directory = false;  // CRIU makes a ghost directory at `path` itself
  // Where the restore writes it: <path>.cr.<id in hex>.ghost; `path` for a
  // directory.
  std::string RestorePath() const;
};

// The ghost files of `images_dir`, in the order of remap-fpath.img. None when
// it holds no remap-fpath.img. kCorruption naming the image when one cannot
// be read as CRIU writes it; kIoError when a file cannot be read.
Result<std::vector<GhostFile>> ReadGhostFiles(const std::string& images_dir);

}  // namespace gpusnap::criu
