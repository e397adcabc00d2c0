// Linked only into the self-contained (statically linked) rdzv-agent and rdzvctl
// (cmake/self_contained.cmake): what such a program sets up before main so that it behaves the
// same in any image.
//
// A statically linked glibc still reads the image's /etc/nsswitch.conf, and for a service it
// does not hold built in (systemd, sss, ldap, mdns...) it would load that service's shared
// module, linked against the image's own glibc, into this process: at best the lookup fails,
// at worst the process crashes. glibc 2.34 and later hold "files" and "dns" built in, and those
// are what a container has: /etc/hosts and the resolver that enroot and Apptainer mount from
// the host, and the /etc/passwd and /etc/group entries they write for the user. So the lookups
// this program makes (node names, the server's admin group, and c-ares' service and protocol
// names) use those two alone.
//
// OpenSSL likewise would read the image's openssl.cnf, written for whatever OpenSSL the image
// has, and could be told there to load a provider or engine module of that version. rdzv needs
// nothing from it (TLS roots come from --tls-ca), so this build reads none.
#include <nss.h>
#include <openssl/crypto.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace {

struct SelfContainedRuntime {
  SelfContainedRuntime() {
    for (const auto& [database, services] :
         {std::pair{"hosts", "files dns"}, std::pair{"passwd", "files"},
          std::pair{"group", "files"}, std::pair{"services", "files"},
          std::pair{"protocols", "files"}}) {
      if (__nss_configure_lookup(database, services) != 0) {
        std::fprintf(stderr, "rdzv: cannot limit the %s lookup to %s; the binary is broken\n",
                     database, services);
        std::abort();
      }
    }
    OPENSSL_init_crypto(OPENSSL_INIT_NO_LOAD_CONFIG | OPENSSL_INIT_NO_ATEXIT, nullptr);
  }
};

const SelfContainedRuntime runtime;

}  // namespace
