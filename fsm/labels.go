package fsm

import (
	"fmt"
	"maps"
	"strings"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// MaxLabelLength bounds label keys and values, as Kubernetes does, so a
// selector stays readable and the Raft entry small.
const MaxLabelLength = 63

// ValidateNodeLabels checks an operator's relabel of a node: keys non-empty,
// without '=', ',' or blanks, keys and values at most MaxLabelLength, no key
// both set and removed. llmgwctl, AdminService and the FSM run it alike.
func ValidateNodeLabels(id string, set map[string]string, remove []string) error {
	if id == "" {
		return invalid("id", "required")
	}
	if len(set) == 0 && len(remove) == 0 {
		return invalid("labels", "give at least one key=value to set or key- to remove")
	}
	for k, v := range set {
		if err := checkLabelKey(fmt.Sprintf("labels[%q]", k), k); err != nil {
			return err
		}
		if len(v) > MaxLabelLength || strings.ContainsAny(v, ", \t\n") {
			return invalid(fmt.Sprintf("labels[%q]", k), "value must be at most %d characters without commas or blanks", MaxLabelLength)
		}
	}
	for _, k := range remove {
		if err := checkLabelKey("remove", k); err != nil {
			return err
		}
		if _, ok := set[k]; ok {
			return invalid("remove", "%q is both set and removed", k)
		}
	}
	return nil
}

func checkLabelKey(field, k string) error {
	switch {
	case k == "":
		return invalid(field, "label keys must not be empty")
	case len(k) > MaxLabelLength:
		return invalid(field, "label key %q is longer than %d characters", k, MaxLabelLength)
	case strings.ContainsAny(k, "=, \t\n"):
		return invalid(field, "label key %q must not contain '=', ',' or blanks", k)
	}
	return nil
}

// setNodeLabels applies an operator's relabel (design §13.3's gated command):
// the node's labels become the operator's from here on, kept across the
// agent's re-registrations.
func (a *applier) setNodeLabels(p *llmgwv1.SetNodeLabelsCommand) (any, error) {
	if err := ValidateNodeLabels(p.Id, p.Set, p.Remove); err != nil {
		return nil, err
	}
	n, ok := a.f.nodes[p.Id]
	if !ok {
		return nil, fmt.Errorf("node %q: %w", p.Id, ErrNotFound)
	}
	n = proto.Clone(n).(*llmgwv1.Node)
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	maps.Copy(n.Labels, p.Set)
	for _, k := range p.Remove {
		delete(n.Labels, k)
	}
	n.LabelsByOperator = true
	n.Revision = a.index
	a.f.nodes[n.Id] = n
	a.put(n)
	return proto.Clone(n), nil
}
