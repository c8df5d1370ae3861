// Package grpcsize holds the gRPC message size the control plane and its
// clients agree on (design §11 "Limits"), so a message one side may send is
// one the other accepts: gRPC's default receive limit (4 MiB) is below what
// a large cluster's watch stream legitimately sends, and a client refusing a
// message ends its stream for good, as every new router's watch did once
// one node's reports had grown to 46 MB.
package grpcsize

// MaxMessageBytes is the largest message a control server sends
// (grpc_max_send_bytes may only lower it) and what the clients that
// receive its big messages — routers' watch streams, agents' sessions —
// accept: a watch stream's full copy of one node's reports, bounded by the
// per-session limits to well under it, or a DesiredReplicas.
const MaxMessageBytes = 64 << 20
