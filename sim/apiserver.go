package sim

import (
	"math/rand/v2"
	"sync"
	"time"
)

// apiServer is the GPU-timed engine's front end as the cost model sees it
// (design §8): what a request spends between arriving and the engine core
// seeing it. vLLM's OpenAI server is one Python asyncio process, so the CPU
// part of that work — parsing, the chat template, tokenising — is done for
// one request at a time: requests that arrive together queue for it, and a
// closed loop's wave of requests reaches the engine spread out, one
// Calibration.RequestSerial apart, rather than all at once. The rest of
// Calibration.RequestOverhead (IPC to the engine core, awaiting) overlaps
// with other requests, and varies by up to ±Calibration.RequestJitter
// (uniformly, from a seeded source): no two requests take exactly as long,
// so equal clients of a closed loop do not stay in lockstep. The server (serveStepped) and the virtual-time
// closed loop (SimulateClosedLoop) both take a request's entry time from
// here, so they see the same front end.
type apiServer struct {
	overhead, serial, jitter, tail time.Duration

	mu  sync.Mutex
	rng *rand.Rand
	// busy is when the serialized work taken on so far ends.
	busy time.Time
}

func newAPIServer(cal Calibration, seed uint64) *apiServer {
	serial := min(cal.RequestSerial, cal.RequestOverhead)
	return &apiServer{overhead: cal.RequestOverhead, serial: serial, tail: cal.RequestTail,
		jitter: min(cal.RequestJitter, cal.RequestOverhead-serial), rng: rand.New(rand.NewPCG(seed, 0x617069))}
}

// enter is when a request that arrives at now reaches the engine: its turn
// at the serialized work, then the rest of the overhead.
func (a *apiServer) enter(now time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := now
	if a.busy.After(start) {
		start = a.busy
	}
	a.busy = start.Add(a.serial)
	rest := a.overhead - a.serial
	if a.jitter > 0 {
		rest += time.Duration(a.rng.Int64N(int64(2*a.jitter)+1)) - a.jitter
	}
	if a.tail > 0 {
		rest += time.Duration(a.rng.ExpFloat64() * float64(a.tail))
	}
	return a.busy.Add(rest)
}
