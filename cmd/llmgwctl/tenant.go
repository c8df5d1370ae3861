package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// limitFlag is one limit of TenantLimits as llmgwctl spells it: a flag of
// tenant create|update (--input-tpm) and a key of --model-limit
// (input-tpm=N). The FSM names it with underscores (input_tpm).
type limitFlag struct {
	name  string
	usage string
	get   func(*llmgwv1.TenantLimits) uint64
	set   func(*llmgwv1.TenantLimits, uint64)
}

// field is the limit's name in a ValidationError.
func (l limitFlag) field() string { return strings.ReplaceAll(l.name, "-", "_") }

// limitFlags are the limits in TenantLimits' order.
var limitFlags = []limitFlag{
	{"rpm", "requests per minute",
		func(l *llmgwv1.TenantLimits) uint64 { return l.GetRpm() }, func(l *llmgwv1.TenantLimits, v uint64) { l.Rpm = v }},
	{"input-tpm", "input (prompt) tokens per minute, cached ones included",
		func(l *llmgwv1.TenantLimits) uint64 { return l.GetInputTpm() }, func(l *llmgwv1.TenantLimits, v uint64) { l.InputTpm = v }},
	{"output-tpm", "output (completion) tokens per minute",
		func(l *llmgwv1.TenantLimits) uint64 { return l.GetOutputTpm() }, func(l *llmgwv1.TenantLimits, v uint64) { l.OutputTpm = v }},
	{"weighted-tpm", "weighted tokens per minute (--weights)",
		func(l *llmgwv1.TenantLimits) uint64 { return l.GetWeightedTpm() }, func(l *llmgwv1.TenantLimits, v uint64) { l.WeightedTpm = v }},
	{"concurrency", "requests in flight at once, fleet-wide",
		func(l *llmgwv1.TenantLimits) uint64 { return l.GetConcurrency() }, func(l *llmgwv1.TenantLimits, v uint64) { l.Concurrency = v }},
	{"daily-tokens", "input + output tokens per UTC day",
		func(l *llmgwv1.TenantLimits) uint64 { return l.GetDailyTokens() }, func(l *llmgwv1.TenantLimits, v uint64) { l.DailyTokens = v }},
	{"monthly-tokens", "input + output tokens per UTC month",
		func(l *llmgwv1.TenantLimits) uint64 { return l.GetMonthlyTokens() }, func(l *llmgwv1.TenantLimits, v uint64) { l.MonthlyTokens = v }},
}

// tenantFlags are tenant create|update's flags as given.
type tenantFlags struct {
	models      []string
	limits      map[string]*int64
	weights     string
	modelLimits []string
	shadow      bool
	// defaultClass and maxClass are the priority classes (design §7.8).
	defaultClass string
	maxClass     string
}

func (f *tenantFlags) register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.models, "models", nil, "models (and adapters) the tenant's keys may use, a,b,...; empty for every model")
	f.limits = map[string]*int64{}
	for _, l := range limitFlags {
		f.limits[l.name] = fs.Int64(l.name, 0, l.usage+"; 0 for no limit")
	}
	fs.StringVar(&f.weights, "weights", "", "weights of weighted-tpm, e.g. input=1,cached=0.1,output=4 (a weight not named is 1)")
	fs.StringArrayVar(&f.modelLimits, "model-limit", nil, "limits on one model's requests, held in addition to the tenant's own: "+
		"MODEL:rpm=N,input-tpm=N,output-tpm=N,weighted-tpm=N,concurrency=N,daily-tokens=N,monthly-tokens=N (repeatable; "+
		"on update it replaces that model's limits, and MODEL: alone removes them)")
	fs.BoolVar(&f.shadow, "shadow", false, "count what the limits would refuse without refusing it (--shadow=false enforces)")
	fs.StringVar(&f.defaultClass, "default-class", "", "the priority `CLASS` of the tenant's requests unless they ask a lower one "+
		"(x-llmgw-priority), one of the routers' flow.classes; empty for the routers' flow.default_class")
	fs.StringVar(&f.maxClass, "max-class", "", "the highest priority `CLASS` the tenant's requests may ask for; empty for its default class")
}

// any reports whether a flag of the tenant's was given.
func (f *tenantFlags) any(fs *pflag.FlagSet) bool {
	for _, n := range []string{"models", "weights", "model-limit", "shadow", "default-class", "max-class"} {
		if fs.Changed(n) {
			return true
		}
	}
	for _, l := range limitFlags {
		if fs.Changed(l.name) {
			return true
		}
	}
	return false
}

// apply sets on t what the flags say: every flag for a create, only those
// given (changed) for an update, so an update leaves the rest as stored.
// A negative or malformed value is refused naming its flag.
func (f *tenantFlags) apply(fs *pflag.FlagSet, t *llmgwv1.Tenant, create bool) error {
	given := func(name string) bool { return create || fs.Changed(name) }
	if given("models") {
		t.Models = f.models
	}
	if t.Limits == nil {
		t.Limits = &llmgwv1.TenantLimits{}
	}
	for _, l := range limitFlags {
		v := *f.limits[l.name]
		if v < 0 {
			return fmt.Errorf("--%s: must not be negative, got %d", l.name, v)
		}
		if given(l.name) {
			l.set(t.Limits, uint64(v))
		}
	}
	if fs.Changed("weights") {
		w, err := parseWeights(f.weights)
		if err != nil {
			return err
		}
		t.Weights = w
	}
	if fs.Changed("model-limit") {
		byModel := map[string]*llmgwv1.TenantModelLimits{}
		for _, ml := range t.ModelLimits {
			byModel[ml.Model] = ml
		}
		for _, spec := range f.modelLimits {
			ml, err := parseModelLimit(spec)
			if err != nil {
				return err
			}
			if ml.Limits == nil {
				delete(byModel, ml.Model)
				continue
			}
			byModel[ml.Model] = ml
		}
		t.ModelLimits = t.ModelLimits[:0]
		for _, ml := range byModel {
			t.ModelLimits = append(t.ModelLimits, ml)
		}
	}
	// Sorted as the server sorts them before validating, so an error's
	// index names the same model here and there.
	slices.SortFunc(t.ModelLimits, func(a, b *llmgwv1.TenantModelLimits) int { return cmp.Compare(a.Model, b.Model) })
	if given("shadow") {
		t.Shadow = f.shadow
	}
	// The classes' shape is checked here, so an update refuses a bad one
	// before it reads the stored tenant. Which classes exist is the
	// routers' flow.classes, which neither llmgwctl nor the control
	// plane knows.
	for _, c := range []struct {
		flag, field string
		v           string
		into        *string
	}{{"default-class", "default_class", f.defaultClass, &t.DefaultClass}, {"max-class", "max_class", f.maxClass, &t.MaxClass}} {
		if !given(c.flag) {
			continue
		}
		var ve *fsm.ValidationError
		if err := fsm.ValidateClass(c.field, c.v); errors.As(err, &ve) {
			return fmt.Errorf("--%s: %s", c.flag, ve.Reason)
		}
		*c.into = c.v
	}
	return nil
}

// parseWeights reads --weights input=1,cached=0.1,output=4 into
// thousandths; a weight not named is 1.
func parseWeights(s string) (*llmgwv1.TokenWeights, error) {
	w := &llmgwv1.TokenWeights{InputMilli: 1000, CachedMilli: 1000, OutputMilli: 1000}
	fields := map[string]*uint32{"input": &w.InputMilli, "cached": &w.CachedMilli, "output": &w.OutputMilli}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		p := fields[k]
		if !ok || p == nil {
			return nil, fmt.Errorf("--weights: %q is not input=N, cached=N or output=N", part)
		}
		x, err := strconv.ParseFloat(v, 64)
		switch {
		case err != nil || math.IsNaN(x) || math.IsInf(x, 0):
			return nil, fmt.Errorf("--weights %s: %q is not a number", k, v)
		case x < 0:
			return nil, fmt.Errorf("--weights %s: must not be negative, got %s", k, v)
		case x*1000 > fsm.MaxWeightMilli:
			return nil, fmt.Errorf("--weights %s: at most %d (1000 ×), got %s", k, fsm.MaxWeightMilli/1000, v)
		}
		*p = uint32(math.Round(x * 1000))
	}
	return w, nil
}

// parseModelLimit reads one --model-limit MODEL:rpm=N,input-tpm=N,...;
// MODEL: alone is a model without limits of its own (Limits nil).
func parseModelLimit(spec string) (*llmgwv1.TenantModelLimits, error) {
	model, rest, ok := strings.Cut(spec, ":")
	if !ok || model == "" {
		return nil, fmt.Errorf("--model-limit: %q is not of the form MODEL:rpm=N,input-tpm=N (and the other limits' flags)", spec)
	}
	ml := &llmgwv1.TenantModelLimits{Model: model}
	if strings.TrimSpace(rest) == "" {
		return ml, nil
	}
	ml.Limits = &llmgwv1.TenantLimits{}
	for part := range strings.SplitSeq(rest, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		i := slices.IndexFunc(limitFlags, func(l limitFlag) bool { return l.name == k })
		if !ok || i < 0 {
			return nil, fmt.Errorf("--model-limit %s: %q is not one of rpm, input-tpm, output-tpm, weighted-tpm, concurrency, daily-tokens, monthly-tokens =N", model, part)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil:
			return nil, fmt.Errorf("--model-limit %s:%s: %q is not a whole number", model, k, v)
		case n < 0:
			return nil, fmt.Errorf("--model-limit %s:%s: must not be negative, got %d", model, k, n)
		}
		limitFlags[i].set(ml.Limits, uint64(n))
	}
	return ml, nil
}

var (
	modelLimitFieldRE = regexp.MustCompile(`^model_limits\[(\d+)\](?:\.(\w+))?$`)
	// validationMsgRE is a server's INVALID_ARGUMENT message: a field in
	// the FSM's spelling, then the reason.
	validationMsgRE = regexp.MustCompile(`^([a-z_]+(?:\[\d+\])?(?:\.[a-z_]+)?): (.*)$`)
)

// tenantFlagName is the flag (or argument) a tenant's field is given by:
// input_tpm is --input-tpm, model_limits[0].rpm is --model-limit MODEL:rpm
// (MODEL from t, sorted as sent), weights.cached is --weights cached.
func tenantFlagName(t *llmgwv1.Tenant, field string) string {
	if m := modelLimitFieldRE.FindStringSubmatch(field); m != nil {
		model := "MODEL"
		if i, err := strconv.Atoi(m[1]); err == nil && i < len(t.GetModelLimits()) {
			model = t.ModelLimits[i].Model
		}
		if m[2] == "" || m[2] == "model" {
			return "--model-limit " + model
		}
		return "--model-limit " + model + ":" + strings.ReplaceAll(m[2], "_", "-")
	}
	switch {
	case field == "name":
		return "NAME"
	case field == "model_limits":
		return "--model-limit"
	case field == "models" || strings.HasPrefix(field, "models["):
		return "--models"
	case field == "weights":
		return "--weights"
	case field == "default_class":
		return "--default-class"
	case field == "max_class":
		return "--max-class"
	case strings.HasPrefix(field, "weights."):
		return "--weights " + strings.TrimPrefix(field, "weights.")
	}
	for _, l := range limitFlags {
		if field == l.field() {
			return "--" + l.name
		}
	}
	return field
}

// tenantFlagError rewrites a tenant's ValidationError, local or a
// server's INVALID_ARGUMENT, to name the flag: "--input-tpm: at most ..."
// rather than "input_tpm: at most ...". Any other error passes unchanged.
func tenantFlagError(t *llmgwv1.Tenant, err error) error {
	field, reason := "", ""
	var ve *fsm.ValidationError
	if errors.As(err, &ve) {
		field, reason = ve.Field, ve.Reason
	} else if st, ok := status.FromError(err); ok && st.Code() == codes.InvalidArgument {
		m := validationMsgRE.FindStringSubmatch(st.Message())
		if m == nil {
			return err
		}
		field, reason = m[1], m[2]
	} else {
		return err
	}
	flag := tenantFlagName(t, field)
	// The reason may name another limit of the same scope
	// (daily_tokens is above monthly_tokens): spelt as its flag too.
	for _, l := range limitFlags {
		name := "--" + l.name
		if strings.HasPrefix(field, "model_limits[") {
			name = l.name
		}
		reason = strings.ReplaceAll(reason, l.field(), name)
	}
	msg := flag + ": " + reason
	if ve != nil {
		return usage(errors.New(msg))
	}
	return status.Error(codes.InvalidArgument, msg)
}

// tenantCmd is `tenant create|update|list|get|delete` (design §7.7).
func (c *cli) tenantCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "Create, update, list, show and delete tenants: their models, limits and budgets"}
	put := func(create bool) *cobra.Command {
		var f tenantFlags
		verb := "update"
		short := "Change the flags given of a tenant, keeping the rest"
		if create {
			verb = "create"
			short = "Create a tenant with the limits given (a limit not given is 0: no limit)"
		}
		sub := &cobra.Command{
			Use: verb + " NAME [--models a,b] [--rpm N] [--input-tpm N] [--output-tpm N] [--weighted-tpm N] [--weights input=1,cached=0.1,output=4] " +
				"[--concurrency N] [--daily-tokens N] [--monthly-tokens N] [--model-limit MODEL:rpm=N,...]... [--shadow[=false]] " +
				"[--default-class CLASS] [--max-class CLASS]",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				name := args[0]
				if create {
					t := &llmgwv1.Tenant{Name: name}
					if err := f.apply(cmd.Flags(), t, true); err != nil {
						return usage(fmt.Errorf("tenant create %s: %w", name, err))
					}
					return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
						return c.putTenantWith(ctx, a, t, true)
					})
				}
				if !f.any(cmd.Flags()) {
					return usage(fmt.Errorf("tenant update %s: no flag given: nothing to change", name))
				}
				// Refused before any call, as create's are.
				if err := f.apply(cmd.Flags(), &llmgwv1.Tenant{Name: name}, false); err != nil {
					return usage(fmt.Errorf("tenant update %s: %w", name, err))
				}
				return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
					t, err := a.GetTenant(ctx, &llmgwv1.GetTenantRequest{Name: name})
					if err != nil {
						return fmt.Errorf("tenant update %s: %w", name, err)
					}
					if err := f.apply(cmd.Flags(), t, false); err != nil {
						return usage(fmt.Errorf("tenant update %s: %w", name, err))
					}
					return c.putTenantWith(ctx, a, t, false)
				})
			},
		}
		f.register(sub.Flags())
		return sub
	}

	var consistent bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List tenants and their limits (- is no limit)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ListTenants(ctx, &llmgwv1.ListRequest{Consistent: consistent})
				if err != nil {
					return fmt.Errorf("tenant list: %w", err)
				}
				if c.output == "json" {
					return c.printItems(messages(resp.Tenants), nil)
				}
				header := []string{"NAME", "MODELS"}
				for _, l := range limitFlags {
					header = append(header, strings.ToUpper(l.name))
				}
				header = append(header, "MODEL LIMITS", "CLASS", "SHADOW")
				rows := make([][]string, 0, len(resp.Tenants))
				for _, t := range resp.Tenants {
					row := []string{t.Name, modelsOf(t.Models)}
					for _, l := range limitFlags {
						row = append(row, limitOf(l.get(t.Limits)))
					}
					rows = append(rows, append(row, strconv.Itoa(len(t.ModelLimits)), classesOf(t), strconv.FormatBool(t.Shadow)))
				}
				return c.printTable(header, rows)
			})
		},
	}
	consistentFlag(list, &consistent)

	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a tenant: its models, limits, per-model limits, weights, shadow mode and priority classes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				t, err := a.GetTenant(ctx, &llmgwv1.GetTenantRequest{Name: args[0]})
				if err != nil {
					return fmt.Errorf("tenant get %s: %w", args[0], err)
				}
				if c.output == "json" {
					return c.printJSON(t)
				}
				return c.printTenant(t)
			})
		},
	}

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a tenant no key belongs to (move or revoke its keys first); its usage stays",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_DELETE_TENANT, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.DeleteTenant(ctx, &llmgwv1.DeleteTenantRequest{Name: args[0]})
				if err != nil {
					return fmt.Errorf("tenant delete %s: %w", args[0], err)
				}
				if c.output == "json" {
					return c.printJSON(map[string]any{"name": args[0], "revision": resp.Revision})
				}
				_, err = fmt.Fprintf(c.out, "tenant %s deleted at revision %d\n", args[0], resp.Revision)
				return err
			})
		},
	}
	cmd.AddCommand(put(true), put(false), list, get, del)
	return cmd
}

// putTenantWith validates t as the server will, naming the flag at fault
// (nothing is sent then), and puts it.
func (c *cli) putTenantWith(ctx context.Context, a llmgwv1.AdminServiceClient, t *llmgwv1.Tenant, create bool) error {
	verb := "update"
	if create {
		verb = "create"
	}
	if err := fsm.ValidateTenant(t); err != nil {
		return fmt.Errorf("tenant %s %s: %w", verb, t.Name, tenantFlagError(t, err))
	}
	resp, err := a.PutTenant(ctx, &llmgwv1.PutTenantRequest{Tenant: t, Create: create})
	if err != nil {
		return fmt.Errorf("tenant %s %s: %w", verb, t.Name, tenantFlagError(t, err))
	}
	if c.output == "json" {
		return c.printJSON(resp)
	}
	_, err = fmt.Fprintf(c.out, "tenant %s %sd at revision %d\n", t.Name, verb, resp.Revision)
	return err
}

// printTenant is `tenant get`'s table: one line per setting.
func (c *cli) printTenant(t *llmgwv1.Tenant) error {
	rows := [][]string{{"name", t.Name}, {"models", modelsOf(t.Models)}}
	for _, l := range limitFlags {
		rows = append(rows, []string{l.name, limitOf(l.get(t.Limits))})
	}
	rows = append(rows, []string{"weights", weightsOf(t.Weights)})
	for _, ml := range t.ModelLimits {
		rows = append(rows, []string{"model-limit", ml.Model + ":" + limitsSpec(ml.Limits)})
	}
	rows = append(rows, []string{"shadow", strconv.FormatBool(t.Shadow)},
		[]string{"default-class", orDefault(t.DefaultClass, "- (the routers' flow.default_class)")},
		[]string{"max-class", orDefault(t.MaxClass, "- (the default class)")},
		[]string{"created", time.Unix(t.CreatedUnix, 0).UTC().Format(time.RFC3339)}, []string{"revision", strconv.FormatUint(t.Revision, 10)})
	return c.printTable([]string{"SETTING", "VALUE"}, rows)
}

// classesOf is `tenant list`'s CLASS: default/max, "-" for one not set
// (the routers' default; the default class), "-" alone for neither.
func classesOf(t *llmgwv1.Tenant) string {
	if t.DefaultClass == "" && t.MaxClass == "" {
		return "-"
	}
	return orDefault(t.DefaultClass, "-") + "/" + orDefault(t.MaxClass, "-")
}

// orDefault is s, or def when s is empty.
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// limitOf is a limit as tables show it: "-" for none.
func limitOf(v uint64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatUint(v, 10)
}

// limitsSpec is a scope's limits as --model-limit takes them, the ones set.
func limitsSpec(l *llmgwv1.TenantLimits) string {
	var parts []string
	for _, f := range limitFlags {
		if v := f.get(l); v > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", f.name, v))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// weightsOf is the weights as --weights takes them.
func weightsOf(w *llmgwv1.TokenWeights) string {
	if w == nil {
		return "input=1,cached=1,output=1 (default)"
	}
	f := func(milli uint32) string { return strconv.FormatFloat(float64(milli)/1000, 'f', -1, 64) }
	return "input=" + f(w.InputMilli) + ",cached=" + f(w.CachedMilli) + ",output=" + f(w.OutputMilli)
}
