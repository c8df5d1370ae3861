// Package benchchat sends the cluster benchmarks' chat completions
// (scripts/tenantbench, scripts/flowbench) and reads what a benchmark
// judges from each: status, time to first token, usage, whether a stream
// ended properly, and the response's headers.
package benchchat

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Request is one chat completion.
type Request struct {
	// Addr is the router's API address, host:port.
	Addr string
	// Key is the API key ("" for none).
	Key       string
	Model     string
	Prompt    string
	MaxTokens int
	Stream    bool
	// CancelAfter > 0 cancels a stream after that many content chunks.
	CancelAfter int
	// Header is sent besides the content type and the key.
	Header http.Header
}

// Result is one request's outcome.
type Result struct {
	Code int
	Sent time.Time
	// TTFT is the time to the first content chunk (streams).
	TTFT time.Duration
	// Elapsed is the time to the end of the response, or to the error.
	Elapsed    time.Duration
	Input, Out int
	Cancelled  bool
	// ConnectError is a request that got no response.
	ConnectError bool
	// Complete is a 200 whose body ended as it should: a stream with its
	// [DONE], a JSON body decoded.
	Complete bool
	Header   http.Header
	// Err is what went wrong, if anything did (the status aside).
	Err error
}

type usage struct {
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// Do sends r with client and reads the whole response.
func Do(ctx context.Context, client *http.Client, r Request) (res Result) {
	res.Sent = time.Now()
	defer func() { res.Elapsed = time.Since(res.Sent) }() // res is named: the deferred write is what the caller gets
	opts := ""
	if r.Stream {
		opts = `,"stream_options":{"include_usage":true}`
	}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%v%s}`,
		r.Model, r.Prompt, r.MaxTokens, r.Stream, opts)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.Addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		res.Err = fmt.Errorf("request: %w", err)
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	if r.Key != "" {
		req.Header.Set("Authorization", "Bearer "+r.Key)
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		res.ConnectError = true
		res.Err = err
		return res
	}
	defer resp.Body.Close()
	res.Code, res.Header = resp.StatusCode, resp.Header
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return res
	}
	var u usage
	if !r.Stream {
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
			res.Err = fmt.Errorf("decode: %w", err)
			return res
		}
		res.Complete = true
		if u.Usage != nil {
			res.Input, res.Out = u.Usage.PromptTokens, u.Usage.CompletionTokens
		}
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			res.Complete = true
			continue
		}
		if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			if chunks == 0 {
				res.TTFT = time.Since(res.Sent)
			}
			chunks++
			if r.CancelAfter > 0 && chunks == r.CancelAfter {
				res.Cancelled = true
				return res
			}
		}
		if strings.Contains(line, `"usage":{`) && json.Unmarshal([]byte(line), &u) == nil && u.Usage != nil {
			res.Input, res.Out = u.Usage.PromptTokens, u.Usage.CompletionTokens
		}
	}
	if err := sc.Err(); err != nil {
		res.Err = fmt.Errorf("stream: %w", err)
		res.Complete = false
	}
	return res
}
