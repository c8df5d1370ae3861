// Package flow is the router's flow control at saturation (design §7.8):
// while a model's replicas have room, a request goes on to be scheduled as
// it arrives and nothing else happens; when they have none, requests wait
// in the router — strict priority between classes, least attained service
// between tenants within a class, each class bounded by count, bytes and a
// TTL — and are dispatched as room frees. A lower class leaves a share of
// the capacity (its headroom) to the classes above it, and holds while
// another router reports a higher class waiting, so that priority holds
// across the fleet and not only within one router.
//
// Why in the router and not the engine: vLLM's queue is FIFO and knows no
// tenant; once a batch job's requests are in it, an interactive request
// waits behind them. Holding the excess in the router, where the tenant
// and class are known, costs nothing below saturation and decides whose
// request goes next above it.
package flow
