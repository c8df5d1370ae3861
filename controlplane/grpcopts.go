package controlplane

import (
	"google.golang.org/grpc"
)

// grpcOptions are the server's message and stream limits (design §11
// "Limits"): gRPC's defaults accept 4 MiB, send without bound and allow
// unlimited concurrent streams per connection; these are explicit, and
// sized by LimitsConfig's reasons.
func (c LimitsConfig) grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(c.GRPCMaxRecvBytes),
		grpc.MaxSendMsgSize(c.GRPCMaxSendBytes),
		grpc.MaxConcurrentStreams(c.GRPCMaxStreamsPerConn),
	}
}
