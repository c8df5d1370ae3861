package admin

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/service"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// LocalKeyring is this server's own ServerService.LocalKeyring (package
// service/server), called directly rather than over gRPC to itself.
type LocalKeyring interface {
	LocalKeyring(ctx context.Context, req *llmgwv1.KeyringRequest) (*llmgwv1.ServerKeyring, error)
}

// keyringTimeout bounds each server's answer to a keyring operation: one
// that does not answer in time is reported as such, and the others' answers
// are not held up by it.
const keyringTimeout = 5 * time.Second

// Keyring runs a gossip keyring operation on every server (design §11):
// this one directly, every other server gossip sees alive over
// ServerService.LocalKeyring, all in parallel, each within keyringTimeout.
// Each server's answer is reported on its own, an error included, so a
// rotation step that missed a server says which; a server of the Raft
// configuration that gossip does not see alive is reported as not reached
// (it keeps its old keys, and must get the step before the next one).
// The call itself fails only for a request that no server could run.
func (a *Service) Keyring(ctx context.Context, req *llmgwv1.KeyringRequest) (*llmgwv1.KeyringResponse, error) {
	if _, err := service.KeyringKey(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	type target struct{ id, addr string }
	var targets []target
	reached := map[string]bool{}
	for _, m := range a.members.Members() {
		// Live is alive or suspect (not yet declared dead), as gossip says.
		if (m.Status != "alive" && m.Status != "suspect") || reached[m.Id] {
			continue
		}
		reached[m.Id] = true
		targets = append(targets, target{m.Id, m.GrpcAddr})
	}
	if !reached[a.self] {
		targets = append(targets, target{id: a.self})
		reached[a.self] = true
	}
	out := make([]*llmgwv1.ServerKeyring, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, keyringTimeout)
			defer cancel()
			out[i] = a.localKeyring(cctx, t.id, t.addr, req)
		})
	}
	wg.Wait()
	for _, s := range a.peers.Servers() {
		if !reached[s.Id] {
			out = append(out, &llmgwv1.ServerKeyring{ServerId: s.Id, Error: "not alive in gossip: not reached (it keeps its keys; run this step again once it is back)"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ServerId < out[j].ServerId })
	failed := 0
	for _, s := range out {
		if s.Error != "" {
			failed++
		}
	}
	a.log.Info("gossip keyring operation", "op", req.GetOp().String(), "servers", len(out), "failed", failed)
	return &llmgwv1.KeyringResponse{Servers: out}, nil
}

// localKeyring is one server's answer, its failure to answer as its error.
func (a *Service) localKeyring(ctx context.Context, id, addr string, req *llmgwv1.KeyringRequest) *llmgwv1.ServerKeyring {
	var (
		resp *llmgwv1.ServerKeyring
		err  error
	)
	switch {
	case id == a.self && a.keyring == nil:
		err = fmt.Errorf("this server does not serve keyring operations")
	case id == a.self:
		resp, err = a.keyring.LocalKeyring(ctx, req)
	case addr == "":
		err = fmt.Errorf("no gRPC address in gossip")
	default:
		resp, err = llmgwv1.NewServerServiceClient(a.peers.Conn(addr)).LocalKeyring(service.ForwardedContext(ctx, a.self), req)
	}
	if err != nil {
		if st, ok := status.FromError(err); ok {
			err = fmt.Errorf("%s: %s", st.Code(), st.Message())
		}
		return &llmgwv1.ServerKeyring{ServerId: id, Error: err.Error()}
	}
	resp.ServerId = id
	return resp
}
