// A TLS server certificate and key read from PEM files and read again when
// the files change, so that a rotated certificate (a renewed Secret, a script
// replacing the files) is served from the next connection on without a
// restart.
//
// How: Install() sets an OpenSSL certificate callback on the server's SSL_CTX.
// At every handshake it stats both files (following symlinks, as a Secret
// volume's ..data swap needs) and, if either's inode, size, mtime or ctime
// changed since they were last read, reads both again. A pair that cannot be
// read or whose key does not match the certificate (say, the cert is written
// and the key not yet) is not taken: the previous pair stays in use, the
// failure is logged once, and the files are tried again when they change.
//
// Thread-safety: all members are safe to call concurrently (handshakes run on
// the server's worker threads). Lifetime: the reloader must outlive every
// SSL_CTX it was installed on; hold it in a shared_ptr next to the server.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include <openssl/ssl.h>

#include "gpusnap/status.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::k8s {

class CertReloader {
 public:
  using LogFn = std::function<void(const std::string&)>;

  // Reads the pair once. kNotFound/kIoError when a file cannot be read,
  // kInvalidArgument when it holds no PEM certificate/key or the key does not
  // match the certificate; messages name the file.
  static Result<std::shared_ptr<CertReloader>> Load(std::string cert_file, std::string key_file, LogFn log);

  // Makes every handshake on `ctx` use the current pair (SSL_CTX_set_cert_cb).
  void Install(SSL_CTX* ctx);

  // Reads the files again if they changed; returns whether a new pair was
  // taken. Called by the certificate callback; public for tests.
  bool Refresh() EXCLUDES(mu_);

  // The SHA-256 fingerprint (hex) of the certificate now served.
  std::string Fingerprint() const EXCLUDES(mu_);

  struct Pair;  // the parsed certificate, its chain and the key
  ~CertReloader();
  CertReloader(const CertReloader&) = delete;
  CertReloader& operator=(const CertReloader&) = delete;

 private:
  struct Stamp {  // of one file; a change of any field means "read again"
    dev_t dev;
    ino_t ino;
    off_t size;
    int64_t mtime_ns;
    int64_t ctime_ns;
    bool operator==(const Stamp&) const = default;
  };
  CertReloader(std::string cert_file, std::string key_file, LogFn log);
  Result<std::pair<Stamp, Stamp>> Stamps() const;
  std::shared_ptr<const Pair> Current() const EXCLUDES(mu_);
  static int OnCertificate(SSL* ssl, void* self);

  const std::string cert_file_;
  const std::string key_file_;
  const LogFn log_;
  mutable Mutex mu_;
  std::shared_ptr<const Pair> pair_ GUARDED_BY(mu_);
  std::pair<Stamp, Stamp> stamps_ GUARDED_BY(mu_){};  // of the files last tried
};

}  // namespace gpusnap::k8s
