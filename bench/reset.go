package bench

import (
	"context"
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

// resetCaches empties the prefix cache of every engine (POST
// /reset_prefix_cache, vLLM's and the simulator's), then waits settle for
// the engines' AllBlocksCleared events to reach the routers' indexes. An
// engine that still refuses after resetRetry is an error naming it: a run
// on a cache that did not reset is the comparison the reset exists to
// prevent.
func resetCaches(ctx context.Context, hc *http.Client, engines []string, settle time.Duration) error {
	if len(engines) == 0 {
		return fmt.Errorf("no engines to reset")
	}
	for _, e := range engines {
		if err := resetOne(ctx, hc, e); err != nil {
			return err
		}
	}
	if !sleepUntil(ctx, time.Now().Add(settle)) {
		return ctx.Err()
	}
	return nil
}

func resetOne(ctx context.Context, hc *http.Client, engine string) error {
	deadline := time.Now().Add(resetRetry)
	url := strings.TrimRight(engine, "/") + "/reset_prefix_cache"
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
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d: %s", resp.StatusCode, errorMessage(body))
			}
			return nil
		}()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("POST %s: %w", url, err)
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return ctx.Err()
		}
	}
}
