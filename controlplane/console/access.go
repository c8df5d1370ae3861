package console

import (
	"fmt"
	"net/http"

	"github.com/llmgw/llmgw/internal/mtls"
)

// Access is who may see the console (design §11). It shows what an
// attacker maps before striking — every model, node, address and server —
// which AdminService shows only to admins, so the console asks the same:
//
//   - TLS (the node serves mutual TLS): only a caller over TLS with an
//     admin certificate of the cluster's CA. Plain HTTP is refused whatever
//     its source, loopback included, as gRPC is: under TLS a local user is
//     not an operator by being local.
//   - Without TLS: only loopback callers, as gRPC may be served only there
//     without TLS, unless Insecure (--insecure), the operator's acceptance
//     that anyone who reaches the listener may act as an admin.
type Access struct {
	TLS      bool
	Insecure bool
}

// Wrap serves h to the callers a allows and refuses the others with a
// message saying what is needed.
func (a Access) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, why := a.check(r); code != 0 {
			http.Error(w, why, code)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// check returns 0 for an allowed caller, else the status and the reason.
func (a Access) check(r *http.Request) (int, string) {
	if !a.TLS {
		if a.Insecure || mtls.IsLoopback(r.RemoteAddr) {
			return 0, ""
		}
		return http.StatusForbidden, fmt.Sprintf("the console answers loopback callers only when the control node runs without TLS (caller %s): give the node --tls-ca, --tls-cert and --tls-key and open it over HTTPS with an admin certificate, or reach it through an SSH tunnel", r.RemoteAddr)
	}
	if r.TLS == nil {
		return http.StatusForbidden, fmt.Sprintf("the console needs HTTPS with an admin certificate: open https://%s%s", r.Host, Prefix)
	}
	if len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return http.StatusUnauthorized, "the console needs an admin certificate of the cluster's CA"
	}
	id, err := mtls.IdentityOf(r.TLS.VerifiedChains[0][0])
	if err != nil {
		return http.StatusUnauthorized, "the console needs an admin certificate: " + err.Error()
	}
	if id.Role != mtls.RoleAdmin {
		return http.StatusForbidden, fmt.Sprintf("the console needs an admin certificate; caller is %s", id)
	}
	return 0, ""
}
