package sim

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestServeDecodeBoundTTFT is TestClosedLoopTTFTUnderConcurrency in real
// time, over HTTP: Mistral-7B on an RTX 4090, 32-token prompts, closed
// loops of 1 and then 4 streaming clients against one server; TTFT p50 at
// 4 clients must be within 1.3 × one client's (in one of three attempts). Both medians come from the
// same run on the same machine, so a busy machine's timer lateness and
// HTTP path weigh on both; the ratio is what is checked, never a time.
func TestServeDecodeBoundTTFT(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time closed loop, ~5 s")
	}
	cfg := testConfig()
	cfg.Model, cfg.GPU, cfg.NumGPUBlocks, cfg.MaxModelLen = "mistralai/Mistral-7B-Instruct-v0.3", "rtx4090", 0, 32768
	cfg.LoadScale = 0
	_, base := serve(t, cfg, nil)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer client.CloseIdleConnections()
	url := base + "/v1/completions"
	const perClient, maxTokens = 8, 16
	// run is a closed loop of c clients, each sending perClient requests
	// one after the other; it returns every request's TTFT.
	run := func(c int) []time.Duration {
		var mu sync.Mutex
		var ttfts []time.Duration
		var wg sync.WaitGroup
		for i := range c {
			wg.Go(func() {
				for j := range perClient {
					// A fresh first word: no prefix-cache hit.
					prompt := fmt.Sprintf("c%dr%dq%d ", c, i, j) + strings.Repeat("word ", 30)
					d, err := firstToken(client, url, prompt, maxTokens)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					ttfts = append(ttfts, d)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return ttfts
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	// A busy machine only adds to a median, and may add to one loop's and
	// not the other's (CI's other packages start and stop between them), so
	// the pair is measured up to three times and passes on the first within
	// 1.3 ×: noise cannot make a fast engine look slow three times running
	// as easily, and a slow one (1.43–1.54 × before the fix, at rest) stays
	// slow in every attempt.
	var seen []string
	for range 3 {
		one, four := run(1), run(4)
		if t.Failed() {
			return
		}
		m1, m4 := median(one), median(four)
		seen = append(seen, fmt.Sprintf("%v at 4 clients, %v at 1 (%.2f ×)", m4, m1, float64(m4)/float64(m1)))
		if float64(m4) <= 1.3*float64(m1) {
			t.Logf("TTFT p50 %s", strings.Join(seen, "; "))
			return
		}
	}
	t.Errorf("TTFT p50 %s: want at most 1.3 × in one of three attempts", strings.Join(seen, "; "))
}

// firstToken streams one completion and returns the time from sending it to
// its first token; it reads the stream to its end.
func firstToken(client *http.Client, url, prompt string, maxTokens int) (time.Duration, error) {
	body := fmt.Sprintf(`{"model":"llama","prompt":%q,"max_tokens":%d,"ignore_eos":true,"stream":true}`, prompt, maxTokens)
	start := time.Now()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %s", resp.Status)
	}
	var ttft time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if ttft == 0 {
			ttft = time.Since(start)
		}
		if line == "data: [DONE]" {
			return ttft, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("stream ended without [DONE]")
}
