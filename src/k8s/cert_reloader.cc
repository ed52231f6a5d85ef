#include "k8s/cert_reloader.h"

#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

namespace gpusnap::k8s {

namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct ChainFree {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};

// OpenSSL's queued errors as one string (and the queue emptied).
std::string OpensslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += out.empty() ? buf : std::string("; ") + buf;
  }
  return out.empty() ? "no PEM data" : out;
}

Result<std::unique_ptr<BIO, BioFree>> OpenPem(const std::string& path) {
  errno = 0;
  std::unique_ptr<BIO, BioFree> bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) {
    int err = errno != 0 ? errno : EIO;
    ERR_clear_error();
    return Status::Errno(err, "opening `{}`", path);
  }
  return bio;
}

int64_t Nanos(const struct timespec& ts) { return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec; }

}  // namespace

struct CertReloader::Pair {
  std::unique_ptr<X509, X509Free> cert;
  std::unique_ptr<STACK_OF(X509), ChainFree> chain;  // intermediates after the leaf, maybe empty
  std::unique_ptr<EVP_PKEY, PkeyFree> key;
  std::string fingerprint;
};

namespace {

Result<std::shared_ptr<CertReloader::Pair>> ReadPair(const std::string& cert_file, const std::string& key_file) {
  auto pair = std::make_shared<CertReloader::Pair>();
  ERR_clear_error();
  GPUSNAP_ASSIGN_OR_RETURN(auto cbio, OpenPem(cert_file));
  pair->cert.reset(PEM_read_bio_X509(cbio.get(), nullptr, nullptr, nullptr));
  if (!pair->cert)
    return Status::Error(Code::kInvalidArgument, "reading a certificate from `{}`: {}", cert_file, OpensslErrors());
  pair->chain.reset(sk_X509_new_null());
  while (X509* extra = PEM_read_bio_X509(cbio.get(), nullptr, nullptr, nullptr)) sk_X509_push(pair->chain.get(), extra);
  ERR_clear_error();  // the end of the file reads as an error

  GPUSNAP_ASSIGN_OR_RETURN(auto kbio, OpenPem(key_file));
  // No passphrase: without this callback OpenSSL would prompt on a terminal.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  pair->key.reset(PEM_read_bio_PrivateKey(kbio.get(), nullptr, no_passphrase, nullptr));
  if (!pair->key)
    return Status::Error(Code::kInvalidArgument, "reading a private key from `{}`: {}", key_file, OpensslErrors());
  if (X509_check_private_key(pair->cert.get(), pair->key.get()) != 1) {
    ERR_clear_error();
    return Status::Error(Code::kInvalidArgument, "the key in `{}` does not match the certificate in `{}`", key_file,
                         cert_file);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  X509_digest(pair->cert.get(), EVP_sha256(), md, &len);
  for (unsigned int i = 0; i < len; ++i) pair->fingerprint += fmt::format("{:02x}", md[i]);
  return pair;
}

}  // namespace

CertReloader::CertReloader(std::string cert_file, std::string key_file, LogFn log)
    : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)), log_(std::move(log)) {}

CertReloader::~CertReloader() = default;

Result<std::shared_ptr<CertReloader>> CertReloader::Load(std::string cert_file, std::string key_file, LogFn log) {
  std::shared_ptr<CertReloader> r(new CertReloader(std::move(cert_file), std::move(key_file), std::move(log)));
  GPUSNAP_ASSIGN_OR_RETURN(auto stamps, r->Stamps());
  GPUSNAP_ASSIGN_OR_RETURN(auto pair, ReadPair(r->cert_file_, r->key_file_));
  MutexLock lock(r->mu_);
  r->stamps_ = stamps;
  r->pair_ = std::move(pair);
  return r;
}

Result<std::pair<CertReloader::Stamp, CertReloader::Stamp>> CertReloader::Stamps() const {
  std::pair<Stamp, Stamp> out;
  for (auto [path, stamp] : {std::pair{&cert_file_, &out.first}, std::pair{&key_file_, &out.second}}) {
    struct stat st {};
    if (stat(path->c_str(), &st) != 0) return Status::Errno(errno, "stat `{}`", *path);
    *stamp = {st.st_dev, st.st_ino, st.st_size, Nanos(st.st_mtim), Nanos(st.st_ctim)};
  }
  return out;
}

bool CertReloader::Refresh() {
  auto stamps = Stamps();
  MutexLock lock(mu_);
  if (!stamps.ok() || *stamps == stamps_) return false;  // a file missing mid-rotation: keep serving
  stamps_ = *stamps;
  auto pair = ReadPair(cert_file_, key_file_);
  if (!pair.ok()) {
    if (log_) log_("certificate not reloaded, still serving the previous one: " + pair.status().ToString());
    return false;
  }
  pair_ = std::move(*pair);
  if (log_) log_(fmt::format("certificate reloaded from `{}` (sha256 {})", cert_file_, pair_->fingerprint));
  return true;
}

std::shared_ptr<const CertReloader::Pair> CertReloader::Current() const {
  MutexLock lock(mu_);
  return pair_;
}

std::string CertReloader::Fingerprint() const { return Current()->fingerprint; }

int CertReloader::OnCertificate(SSL* ssl, void* self) {
  auto* r = static_cast<CertReloader*>(self);
  r->Refresh();
  std::shared_ptr<const Pair> p = r->Current();
  // SSL_use_cert_and_key takes its own references: the pair may go away after.
  return SSL_use_cert_and_key(ssl, p->cert.get(), p->key.get(), p->chain.get(), 1) == 1 ? 1 : 0;
}

void CertReloader::Install(SSL_CTX* ctx) { SSL_CTX_set_cert_cb(ctx, &CertReloader::OnCertificate, this); }

}  // namespace gpusnap::k8s
