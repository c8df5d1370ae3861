package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// resetRetry bounds how long one engine's reset is retried: vLLM refuses
// a reset while a request still holds cached blocks, which the last
// requests of a run may for a moment after their streams end.
const resetRetry = 10 * time.Second

// noResetHint says why an engine may lack the reset and what to do. vLLM
// mounts POST /reset_prefix_cache only in its development mode; other
// vLLM-compatible engines may have none at all.
const noResetHint = "vLLM serves it only with VLLM_SERVER_DEV_MODE=1"

// errNoReset is an engine that answered the reset 404, 405 or 501: it has
// no such endpoint, and asking again will not change that.
var errNoReset = errors.New("no POST /reset_prefix_cache")

// resetCaches empties the prefix cache of every engine (POST
// /reset_prefix_cache?reset_external=true, vLLM's and the simulator's: the
// query also empties a KV connector's cache, such as the CPU tier of
// --kv-offloading-size, which would otherwise start the next run warm;
// engines that do not know it ignore it), then waits settle for
// the engines' AllBlocksCleared events to reach the routers' indexes. An
// engine that still refuses after resetRetry is an error naming it: a run
// on a cache that did not reset is the comparison the reset exists to
// prevent. An engine without the endpoint is not an error: it is returned
// in noReset, for the caller to mark the run (Report.CacheNotReset); the
// others are still reset.
func resetCaches(ctx context.Context, hc *http.Client, engines []string, settle time.Duration) (noReset []string, err error) {
	if len(engines) == 0 {
		return nil, fmt.Errorf("no engines to reset")
	}
	for _, e := range engines {
		err := resetOne(ctx, hc, e)
		if errors.Is(err, errNoReset) {
			noReset = append(noReset, e)
			continue
		}
		if err != nil {
			return noReset, err
		}
	}
	if len(noReset) == len(engines) {
		return noReset, nil // nothing was reset: nothing to settle
	}
	if !sleepUntil(ctx, time.Now().Add(settle)) {
		return noReset, ctx.Err()
	}
	return noReset, nil
}

func resetOne(ctx context.Context, hc *http.Client, engine string) error {
	deadline := time.Now().Add(resetRetry)
	url := strings.TrimRight(engine, "/") + "/reset_prefix_cache?reset_external=true"
	for {
		err := func() error {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(rctx, http.MethodPost, url, nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
			switch resp.StatusCode {
			case http.StatusOK:
				return nil
			case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
				return fmt.Errorf("%w: status %d", errNoReset, resp.StatusCode)
			}
			return fmt.Errorf("status %d: %s", resp.StatusCode, errorMessage(body))
		}()
		if err == nil {
			return nil
		}
		if errors.Is(err, errNoReset) || ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("POST %s: %w", url, err)
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return ctx.Err()
		}
	}
}
