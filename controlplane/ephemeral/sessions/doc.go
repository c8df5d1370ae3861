// Package sessions knows which nodes have an agent session attached — on
// this control server, or (as the ephemeral plane announces, design §5.4)
// on any other — and since when a node has had none.
//
// The AgentService records the sessions it holds; ListNodes reports who is
// connected; the leader counts a node down only after it has had no
// session anywhere for NodeDownAfter (design §5.4, the grace after winning
// office), so a failover never reschedules replicas that are still
// serving. It is its own package because those three readers sit in three
// packages, none of which should own the others' state.
package sessions
