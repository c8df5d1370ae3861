package chunking

// MaxMessageBytes is the gRPC message size the control plane and its
// clients agree on (design §11 "Limits"), so a message one side may send
// is one the other accepts: the largest message a control server sends
// (grpc_max_send_bytes may only lower it), and what the clients that
// receive its big messages — routers' watch streams, agents' sessions —
// accept. gRPC's default receive limit (4 MiB) is below what a large
// cluster's watch stream once legitimately sent, and a client refusing a
// message ends its stream for good, as every new router's watch did once
// one node's reports had grown to 46 MB.
//
// It lives beside the chunk framing because the two are one contract:
// ephemeral updates no longer come near it, since one larger than
// ephemeral_chunk_bytes (1 MiB) travels in chunks to clients that ask for
// them (design §5.4 "Chunks"). It stays for a DesiredReplicas, and for the
// whole updates a server sends a router of a release before chunks.
const MaxMessageBytes = 64 << 20
