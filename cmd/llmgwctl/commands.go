package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func (c *cli) modelCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "model", Short: "Apply, list and delete models"}
	var file string
	apply := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or update a model from a YAML file (- for stdin)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usage(errors.New("-f: a model file is required"))
			}
			in, err := openFileFlag(file)
			if err != nil {
				return err
			}
			defer in.Close()
			m, err := parseModelFile(in)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: m})
				if err != nil {
					return fmt.Errorf("model apply: %w", err)
				}
				if c.output == "json" {
					return c.printJSON(resp)
				}
				_, err = fmt.Fprintf(c.out, "model %s applied at revision %d\n", m.Name, resp.Revision)
				return err
			})
		},
	}
	apply.Flags().StringVarP(&file, "file", "f", "", "the model's YAML file, or - for stdin")

	var consistent bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List models",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ListModels(ctx, &llmgwv1.ListRequest{Consistent: consistent})
				if err != nil {
					return fmt.Errorf("model list: %w", err)
				}
				if c.output == "json" {
					return c.printItems(messages(resp.Models), nil)
				}
				rows := make([][]string, 0, len(resp.Models))
				for _, m := range resp.Models {
					rows = append(rows, []string{m.Name, m.Engine, m.Model, strconv.Itoa(replicaCount(m)),
						strconv.Itoa(int(m.GpusPerReplica)), orDash(m.Profile)})
				}
				return c.printTable([]string{"NAME", "ENGINE", "MODEL", "REPLICAS", "GPUS/REPLICA", "PROFILE"}, rows)
			})
		},
	}
	consistentFlag(list, &consistent)

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a model; its replicas are stopped",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.DeleteModel(ctx, &llmgwv1.DeleteModelRequest{Name: args[0]})
				if err != nil {
					return fmt.Errorf("model delete: %w", err)
				}
				if c.output == "json" {
					return c.printJSON(resp)
				}
				_, err = fmt.Fprintf(c.out, "model %s deleted at revision %d\n", args[0], resp.Revision)
				return err
			})
		},
	}
	statusCmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a model's count, its replicas, why any is missing, and the autoscaler's decisions",
		Long: "Show the count placement works to (the autoscaler's, or replicas), how many replicas are placed, ready and asleep,\n" +
			"why any cannot be placed, and for an autoscaled model the demand the routers report and the leader's last decisions,\n" +
			"newest first, each with its reason; a step the autoscaler could not take says why (HELD).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				st, err := a.ModelStatus(ctx, &llmgwv1.ModelStatusRequest{Name: args[0]})
				if err != nil {
					return fmt.Errorf("model status: %w", err)
				}
				if c.output == "json" {
					return c.printJSON(st)
				}
				return c.printModelStatus(st)
			})
		},
	}
	cmd.AddCommand(apply, list, del, statusCmd)
	return cmd
}

// printModelStatus is `model status` as text: the counts, the reason for
// any missing replica, then the autoscaler's demand and decisions.
func (c *cli) printModelStatus(st *llmgwv1.ModelStatusResponse) error {
	m := st.GetModel()
	fmt.Fprintf(c.out, "model %s: %d desired, %d placed, %d ready", m.GetName(), st.GetDesired(), st.GetPlaced(), st.GetReady())
	if st.GetSleeping() > 0 {
		fmt.Fprintf(c.out, ", %d asleep", st.GetSleeping())
	}
	fmt.Fprintln(c.out)
	if why := st.GetUnplacedReason(); why != "" {
		fmt.Fprintf(c.out, "not placed: %s\n", why)
	}
	a := m.GetAutoscale()
	if a == nil {
		_, err := fmt.Fprintf(c.out, "replicas: %d (no autoscale)\n", m.GetReplicas())
		return err
	}
	fmt.Fprintf(c.out, "autoscale: %d..%d", a.GetMin(), a.GetMax())
	if s := st.GetScale(); s != nil {
		fmt.Fprintf(c.out, ", set to %d at %s: %s", s.GetReplicas(), time.UnixMilli(s.GetDecidedUnixMs()).UTC().Format(time.RFC3339), s.GetReason())
	}
	fmt.Fprintln(c.out)
	if d := st.GetDemand(); d != nil {
		fmt.Fprintf(c.out, "demand: %d held, %.1f waiting, %.1f running on %d replicas, %d requests in the last minute\n",
			d.GetHeld(), d.GetWaiting(), d.GetRunning(), d.GetReplicas(), d.GetRequests())
	}
	if len(st.GetEvents()) == 0 {
		_, err := fmt.Fprintln(c.out, "no decision yet on this leader")
		return err
	}
	rows := make([][]string, 0, len(st.GetEvents()))
	for _, e := range st.GetEvents() {
		what := "STEP"
		if e.GetBlocked() {
			what = "HELD"
		}
		rows = append(rows, []string{time.UnixMilli(e.GetUnixMs()).UTC().Format(time.TimeOnly), what,
			strconv.FormatUint(uint64(e.GetFrom()), 10), strconv.FormatUint(uint64(e.GetTo()), 10), e.GetReason()})
	}
	return c.printTable([]string{"AT", "", "FROM", "TO", "REASON"}, rows)
}

// replicaCount is the REPLICAS column of `model list`. A model of engine
// "external" has one replica per endpoint (design §5.5: placement gives each
// endpoint an owning agent); its stored replicas field is not read by
// placement and holds whatever the model file defaulted it to (1), so the
// endpoints are counted instead.
func replicaCount(m *llmgwv1.Model) int {
	if m.GetEngine() == "external" {
		return len(m.GetEndpoints())
	}
	return int(m.GetReplicas())
}

func (c *cli) nodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Inspect, drain and undrain GPU nodes"}
	var consistent bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List registered nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ListNodes(ctx, &llmgwv1.ListRequest{Consistent: consistent})
				if err != nil {
					return fmt.Errorf("node list: %w", err)
				}
				if c.output == "json" {
					return c.printItems(messages(resp.Nodes), func(i int, obj object) object {
						return append(obj, member{"connected", resp.Connected[resp.Nodes[i].GetId()]})
					})
				}
				rows := make([][]string, 0, len(resp.Nodes))
				for _, n := range resp.Nodes {
					rows = append(rows, []string{n.Id, n.Address, strconv.Itoa(int(n.Gpus)), stateName(n.State.String(), "NODE_STATE_"),
						strconv.FormatBool(resp.Connected[n.Id]), orDash(n.Version), labels(n.Labels)})
				}
				return c.printTable([]string{"ID", "ADDRESS", "GPUS", "STATE", "CONNECTED", "VERSION", "LABELS"}, rows)
			})
		},
	}
	consistentFlag(list, &consistent)
	cmd.AddCommand(list)
	cmd.AddCommand(c.nodeDrainCmds()...)
	return cmd
}

func (c *cli) replicaCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "replica", Short: "Inspect replicas"}
	var consistent bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List replicas with their node, address and state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ListReplicas(ctx, &llmgwv1.ListRequest{Consistent: consistent})
				if err != nil {
					return fmt.Errorf("replica list: %w", err)
				}
				if c.output == "json" {
					return c.printReplicas(resp.Replicas)
				}
				rows := make([][]string, 0, len(resp.Replicas))
				for _, v := range resp.Replicas {
					r, s := v.GetReplica(), v.GetStatus()
					state := "unknown"
					if s != nil && s.Uid == r.GetUid() {
						state = stateName(s.Phase.String(), "REPLICA_PHASE_")
					}
					if r.GetDraining() {
						state += " (draining)"
					}
					rows = append(rows, []string{r.GetId(), r.GetModel(), r.GetNode(), orDash(s.GetAddress()), state,
						strconv.FormatUint(r.GetUid(), 10), strconv.FormatUint(s.GetIncarnation(), 10), strconv.Itoa(int(s.GetRestarts())),
						kvState(v.GetKv())})
				}
				return c.printTable([]string{"ID", "MODEL", "NODE", "ADDRESS", "STATE", "UID", "INCARNATION", "RESTARTS", "KV"}, rows)
			})
		},
	}
	consistentFlag(list, &consistent)
	cmd.AddCommand(list)
	return cmd
}

// kvState is a replica's KV column: its mirror's size, or "untrusted" and
// why (routers then place it by tier 1, design §7.5); "-" without KV
// events. Last, as the reason is as long as it needs to be.
func kvState(k *llmgwv1.ReplicaKV) string {
	switch {
	case k == nil:
		return "-"
	case k.GetUntrusted():
		return "untrusted: " + orDash(k.GetUntrustedReason())
	}
	return strconv.FormatUint(k.GetBlocks(), 10) + " blocks"
}

func (c *cli) clusterCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "The control plane as a whole"}
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "Leader, voters, health, failure tolerance, versions and revision",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
				if err != nil {
					return fmt.Errorf("cluster status: %w", err)
				}
				// Servers by id, so the listing is the same whichever server answers.
				sort.Slice(resp.Servers, func(i, j int) bool { return resp.Servers[i].Id < resp.Servers[j].Id })
				if c.output == "json" {
					return c.printJSON(resp)
				}
				// The figures an operator checks before touching a server:
				// whether autopilot calls the cluster healthy and how many
				// voters may fail before quorum is lost (design §5.2).
				fmt.Fprintf(c.out, "cluster id:        %s\n", orDash(resp.ClusterId))
				fmt.Fprintf(c.out, "leader:            %s\n", orDash(resp.Leader))
				fmt.Fprintf(c.out, "voters:            %d\n", resp.Voters)
				fmt.Fprintf(c.out, "healthy:           %t\n", resp.Healthy)
				fmt.Fprintf(c.out, "failure tolerance: %d\n", resp.FailureTolerance)
				fmt.Fprintf(c.out, "min version:       %s\n", orDash(resp.MinVersion))
				fmt.Fprintf(c.out, "revision:          %d\n", resp.Revision)
				fmt.Fprintf(c.out, "answered by:       %s\n\n", orDash(resp.ServerId))
				rows := make([][]string, 0, len(resp.Servers))
				for _, s := range resp.Servers {
					rows = append(rows, []string{s.Id, s.GrpcAddr, s.RaftAddr, orDash(s.GossipAddr), strconv.FormatBool(s.Leader), strconv.FormatBool(s.Voter), orDash(s.Version)})
				}
				return c.printTable([]string{"ID", "GRPC", "RAFT", "GOSSIP", "LEADER", "VOTER", "VERSION"}, rows)
			})
		},
	})
	return cmd
}

// consistentFlag is --consistent on a list command (design §5.3): the
// server at --addr answers from its own copy of the state unless asked,
// which may lag the leader's by the last writes; with it the leader
// answers, after its post-election barrier and after confirming with a
// quorum that it still leads, so the list holds every write that
// completed before it was asked.
func consistentFlag(cmd *cobra.Command, p *bool) {
	cmd.Flags().BoolVar(p, "consistent", false, "have the leader answer, after confirming its leadership with a quorum: the list holds every write completed before it (default: the server at --addr answers from its copy, which may lag)")
}

// stateName turns NODE_STATE_ACTIVE into "active".
func stateName(enum, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(enum, prefix))
}

func labels(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// openFileFlag opens the file an apply's -f names, standard input for
// "-" (closing it then is a no-op).
func openFileFlag(file string) (io.ReadCloser, error) {
	if file == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("-f: %w", err)
	}
	return f, nil
}

// printReplicas is `replica list -o json`: one flat object per replica,
// the placement's fields (id, uid, model, node, draining, ...), then
// state as the table's STATE column says it, then the running engine's
// fields (address, incarnation, restarts, pid, message, ...) and its KV
// index. A status of an older uid is not this replica's: its state reads
// unknown and its engine fields are empty, as the table shows.
func (c *cli) printReplicas(views []*llmgwv1.ReplicaView) error {
	list := make([]any, 0, len(views))
	for _, v := range views {
		r, s := v.GetReplica(), v.GetStatus()
		state := "unknown"
		if s == nil || s.GetUid() != r.GetUid() {
			s = &llmgwv1.ReplicaStatus{}
		} else {
			state = stateName(s.GetPhase().String(), "REPLICA_PHASE_")
		}
		rj, err := toJSON(orZero(r))
		if err != nil {
			return err
		}
		sj, err := toJSON(s)
		if err != nil {
			return err
		}
		kv := v.GetKv()
		if kv == nil {
			kv = &llmgwv1.ReplicaKV{}
		}
		kj, err := toJSON(kv)
		if err != nil {
			return err
		}
		obj := append(rj.(object), member{"state", state})
		for _, m := range sj.(object) {
			switch m.key {
			case "replica_id", "uid", "model", "node", "phase":
				// The placement's, or state.
			default:
				obj = append(obj, m)
			}
		}
		list = append(list, append(obj, member{"kv", kj}))
	}
	return c.printJSON(list)
}

// orZero is r, or an empty replica for a view without one.
func orZero(r *llmgwv1.Replica) *llmgwv1.Replica {
	if r == nil {
		return &llmgwv1.Replica{}
	}
	return r
}
