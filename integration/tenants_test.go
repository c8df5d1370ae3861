package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTenants (issue 28) runs `llmgw dev` and two more routers on its
// control plane, all real processes:
//   - bad input (an unknown tenant, a negative or absurd limit, deleting a
//     tenant keys belong to) is refused naming the flag, and nothing is
//     applied;
//   - a tenant limited to R requests a minute, offered far more across the
//     three routers, is admitted at most its limit fleet-wide (plus the
//     routers' bursts), and its refusals are OpenAI's 429 with Retry-After
//     and x-ratelimit-* headers;
//   - another tenant on the same routers meanwhile gets no 429;
//   - `llmgwctl usage` equals, for the second tenant, the usage blocks its
//     answers carried, with cancelled streams counted by the chunks sent,
//     and the count survives a router's orderly stop.
func TestTenants(t *testing.T) {
	d := startDev(t)
	r2 := startRouterWith(t, "r2", []string{d.grpc})
	r3 := startRouterWith(t, "r3", []string{d.grpc})
	routers := []string{d.http, r2.http, r3.http}

	t.Run("bad input names the flag and applies nothing", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"tenant", "create", "neg", "--rpm", "-5"}, "--rpm"},
			{[]string{"tenant", "create", "huge", "--input-tpm", "2000000000000"}, "--input-tpm"},
			{[]string{"tenant", "create", "day", "--daily-tokens", "100", "--monthly-tokens", "10"}, "--daily-tokens"},
			{[]string{"apikey", "create", "stray", "--tenant", "nosuch"}, "nosuch"},
		} {
			if out, err := d.ctl(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("llmgwctl %s: %v %s; want a refusal naming %s", strings.Join(tc.args, " "), err, out, tc.want)
			}
		}
		out, err := d.ctl("tenant", "list", "-o", "json")
		if err != nil || strings.Contains(out, `"neg"`) || strings.Contains(out, `"huge"`) || strings.Contains(out, `"day"`) {
			t.Errorf("tenant list after refusals: %v %s", err, out)
		}
		if out, err := d.ctl("apikey", "list"); err != nil || strings.Contains(out, "stray") {
			t.Errorf("apikey list after a refused create: %v %s", err, out)
		}
	})

	const rpm = 30
	if _, err := d.ctl("tenant", "create", "team", "--rpm", strconv.Itoa(rpm)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"free", "meter"} {
		if _, err := d.ctl("tenant", "create", name); err != nil {
			t.Fatal(err)
		}
	}
	team := createKey(t, d.grpc, "team-key", "--tenant", "team")
	free := createKey(t, d.grpc, "free-key", "--tenant", "free")
	meter := createKey(t, d.grpc, "meter-key", "--tenant", "meter")
	if out, err := d.ctl("tenant", "delete", "team"); err == nil || !strings.Contains(err.Error(), "team-key") {
		t.Errorf("deleting a tenant a key belongs to: %v %s; want a refusal naming the key", err, out)
	}
	for _, addr := range routers {
		if !eventually(20*time.Second, func() bool { c, _ := chatAs(addr, "demo", free); return c == http.StatusOK }) {
			t.Fatalf("router %s does not serve the free tenant's key within %v", addr, within(20*time.Second))
		}
		// Its share of team's limit has been leased: one request passes.
		if !eventually(20*time.Second, func() bool { c, _ := chatAs(addr, "demo", team); return c == http.StatusOK }) {
			t.Fatalf("router %s admits nothing of tenant team within %v", addr, within(20*time.Second))
		}
	}

	t.Run("a limit holds across routers, with OpenAI's 429", func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		admitted, refused, freeRefused := 0, 0, 0
		var sample *http.Response
		var wg sync.WaitGroup
		for i := range 90 { // 90 requests in ~9 s, 3× the limit's pace
			wg.Add(2)
			addr := routers[i%3]
			go func() {
				defer wg.Done()
				resp, err := post(addr, team, `{"model":"demo","messages":[{"role":"user","content":"ping"}],"max_tokens":2}`)
				if err != nil {
					return
				}
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				switch resp.StatusCode {
				case http.StatusOK:
					admitted++
				case http.StatusTooManyRequests:
					refused++
					if sample == nil {
						sample = resp
					}
				}
			}()
			go func() {
				defer wg.Done()
				if c, _ := chatAs(addr, "demo", free); c == http.StatusTooManyRequests {
					mu.Lock()
					freeRefused++
					mu.Unlock()
				}
			}()
			time.Sleep(100 * time.Millisecond)
		}
		wg.Wait()
		elapsed := time.Since(start)
		// The limit over the elapsed time, each router's full bucket
		// (two seconds of its share) and one request's debt each.
		bound := int(float64(rpm)*elapsed.Minutes()) + 3*2
		if admitted == 0 || admitted > bound || refused == 0 {
			t.Errorf("tenant team (rpm %d) over %v: %d admitted, %d refused; want 1..%d admitted and some refused", rpm, elapsed, admitted, refused, bound)
		}
		t.Logf("tenant team (rpm %d) over %v: %d admitted, %d refused (bound %d)", rpm, elapsed.Round(time.Millisecond), admitted, refused, bound)
		if freeRefused > 0 {
			t.Errorf("the free tenant got %d × 429 on the same routers", freeRefused)
		}
		if sample != nil {
			h := sample.Header
			if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < 1 {
				t.Errorf("429 Retry-After %q", h.Get("Retry-After"))
			}
			if h.Get("X-Ratelimit-Limit-Requests") != strconv.Itoa(rpm) || h.Get("X-Ratelimit-Remaining-Requests") == "" || h.Get("X-Ratelimit-Reset-Requests") == "" {
				t.Errorf("429 x-ratelimit headers: %v", h)
			}
		}
		resp, err := post(d.http, team, `{"model":"demo","messages":[{"role":"user","content":"ping"}],"max_tokens":2}`)
		if err == nil {
			var e struct {
				Error struct{ Message, Type, Code string } `json:"error"`
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				if json.NewDecoder(resp.Body).Decode(&e) != nil || e.Error.Code != "rate_limit_exceeded" || e.Error.Type != "requests" ||
					!strings.Contains(e.Error.Message, "requests per minute") {
					t.Errorf("429 body %+v: want OpenAI's rate_limit_exceeded naming the limit", e)
				}
			}
			resp.Body.Close()
		}
	})

	t.Run("usage equals the answers' usage, cancelled streams included", func(t *testing.T) {
		var in, out, requests, cancelled int
		for i := range 12 {
			addr := routers[i%3]
			cancelAfter := 0
			if i%4 == 3 {
				cancelAfter = 3
				cancelled++
			}
			pi, po, ok := streamAs(t, addr, meter, 12, cancelAfter)
			if !ok {
				t.Fatalf("stream %d through %s failed", i, addr)
			}
			in, out, requests = in+pi, out+po, requests+1
		}
		// r2 stops in order: its last batch is flushed on the way out.
		r2.stop()
		var got usageCounts
		if !eventually(30*time.Second, func() bool {
			got = tenantUsage(t, d, "meter")
			return got.Requests >= uint64(requests)
		}) {
			t.Fatalf("usage of meter: %d requests metered, want %d", got.Requests, requests)
		}
		// A cancelled stream counts the chunks the router relayed: those
		// the client read, and at most the one or two in flight when it
		// left; its prompt is the router's estimate (no usage chunk came),
		// within a prompt's length of the engine's count here.
		lo, hi := uint64(in-cancelled*streamPrompt), uint64(in+cancelled*streamPrompt)
		if got.Requests != uint64(requests) || got.InputTokens < lo || got.InputTokens > hi ||
			got.OutputTokens < uint64(out) || got.OutputTokens > uint64(out+2*cancelled) {
			t.Errorf("usage of meter: %+v; want %d requests, %d..%d input and %d..%d output tokens as the answers said (cancelled streams: the chunks sent)",
				got, requests, lo, hi, out, out+2*cancelled)
		}
	})
}

// post sends a chat body with secret through addr.
func post(addr, secret, body string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+secret)
	return chatClient.Do(req)
}

// streamAs streams a chat with usage asked and returns its prompt and
// completion tokens: from the usage chunk, or when cancelAfter > 0, the
// stream is cancelled after that many content chunks and those are its
// output (the prompt as the last usage seen by an uncancelled stream of
// the same body: every stream here sends the same prompt).
func streamAs(t *testing.T, addr, secret string, maxTokens, cancelAfter int) (in, out int, ok bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := fmt.Sprintf(`{"model":"demo","messages":[{"role":"user","content":"count the tokens"}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := chatClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for sc.Scan() {
		data, found := strings.CutPrefix(sc.Text(), "data: ")
		if !found || data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &c) != nil {
			continue
		}
		if c.Usage != nil {
			streamPrompt = c.Usage.PromptTokens
			return c.Usage.PromptTokens, c.Usage.CompletionTokens, true
		}
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
			chunks++
			if cancelAfter > 0 && chunks == cancelAfter {
				cancel()
				return streamPrompt, chunks, streamPrompt > 0
			}
		}
	}
	return 0, 0, false
}

// streamPrompt is the prompt tokens of streamAs's body, as the last
// uncancelled stream reported them.
var streamPrompt int

type usageCounts struct {
	Requests     uint64 `json:"requests"`
	InputTokens  uint64 `json:"input_tokens"`
	OutputTokens uint64 `json:"output_tokens"`
}

// tenantUsage sums `llmgwctl usage --tenant T -o json`.
func tenantUsage(t *testing.T, d *devProcess, tenant string) usageCounts {
	t.Helper()
	out, err := d.ctl("usage", "--tenant", tenant, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Counts usageCounts `json:"counts"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("usage -o json: %v: %s", err, out)
	}
	var sum usageCounts
	for _, r := range rows {
		sum.Requests += r.Counts.Requests
		sum.InputTokens += r.Counts.InputTokens
		sum.OutputTokens += r.Counts.OutputTokens
	}
	return sum
}
