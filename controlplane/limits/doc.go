// Package limits caps the long-lived streams one caller may hold on a
// control node (design §11 "Limits"): watch streams and agent sessions per
// caller, counted by a gRPC stream interceptor, so that no client — an
// anonymous one least of all — can pin the node's memory and goroutines by
// opening thousands of them.
//
// A caller is its certificate identity (mtls.FromContext) when the
// connection is mTLS, else its IP address. The two are capped separately:
// an identity is one agent or one router, while one address may carry many
// plain-text clients (every process of `llmgw dev` or a test shares
// 127.0.0.1), so its caps are higher. Servers (role server) are not capped:
// they only forward.
package limits
