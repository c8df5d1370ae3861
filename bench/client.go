package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Sample is what one request measured. Durations count from the moment the
// request was sent.
type Sample struct {
	// Target is the label of the router the request went to.
	Target string
	// Replica is the router's X-Llmgw-Replica header: which replica served.
	Replica string
	// RequestID is the X-Request-ID sent, so a failure can be found in the
	// router's and engine's logs.
	RequestID string
	SessionID string
	Model     string
	// Start is when the request was sent, from the start of the run.
	Start time.Duration
	// TTFT is the time to the first token; zero when none came.
	TTFT time.Duration
	// ITL holds the gaps between successive tokens.
	ITL []time.Duration
	// E2E is the time to the end of the stream.
	E2E                                          time.Duration
	PromptTokens, CachedTokens, CompletionTokens int
	// Status is the HTTP status, 0 when none arrived.
	Status int
	// ErrKind is empty on success, else one of the kinds in errKind.
	ErrKind string
	Err     string

	// messages and answer are the request's prompt and the text it got,
	// kept for the ceiling, which tokenizes them after the run.
	messages []Message
	answer   string
}

// OK reports whether the request succeeded.
func (s Sample) OK() bool { return s.ErrKind == "" }

// maxErrorBody bounds how much of an error response is kept.
const maxErrorBody = 4 << 10

// send makes one streamed request to baseURL in the API's wire form (chat
// when empty) and returns the sample and the answer's text. It never returns
// an error: failures are samples too.
func send(ctx context.Context, hc *http.Client, baseURL, label, requestID, apiKey, api string, req Request, start time.Time, now func() time.Time) (Sample, string) {
	s := Sample{Target: label, RequestID: requestID, SessionID: req.SessionID, Model: req.Model}
	raw, err := encodeBody(api, req)
	if err != nil {
		return fail(s, "encode", err), ""
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(baseURL, "/")+apiPath(api), bytes.NewReader(raw))
	if err != nil {
		return fail(s, "encode", err), ""
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if requestID != "" {
		hreq.Header.Set("X-Request-ID", requestID)
	}
	if req.SessionID != "" {
		hreq.Header.Set("X-Session-ID", req.SessionID)
	}
	if apiKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+apiKey)
		if api == APIMessages {
			// Anthropic's clients send their key so.
			hreq.Header.Set("X-Api-Key", apiKey)
		}
	}
	t0 := now()
	s.Start = t0.Sub(start)
	resp, err := hc.Do(hreq)
	if err != nil {
		s.E2E = now().Sub(t0)
		return fail(s, errKind(ctx, err, "transport"), err), ""
	}
	defer resp.Body.Close()
	s.Status = resp.StatusCode
	s.Replica = resp.Header.Get("X-Llmgw-Replica")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		s.E2E = now().Sub(t0)
		return fail(s, fmt.Sprintf("http_%d", resp.StatusCode), fmt.Errorf("status %d: %s", resp.StatusCode, errorMessage(msg))), ""
	}
	res, err := readStreamWith(resp.Body, parserFor(api), t0, now)
	s.TTFT, s.ITL, s.E2E = res.ttft, res.itl, res.last
	if res.usage != nil {
		s.PromptTokens = res.usage.PromptTokens
		s.CompletionTokens = res.usage.CompletionTokens
		s.CachedTokens = res.usage.CachedTokens()
	} else {
		s.CompletionTokens = res.tokens
	}
	if err != nil {
		return fail(s, errKind(ctx, err, "stream"), err), ""
	}
	return s, res.answer
}

func fail(s Sample, kind string, err error) Sample {
	s.ErrKind, s.Err = kind, err.Error()
	return s
}

// errKind names a failure for errors_by_kind: the run's own end and a
// request's timeout are told apart from the target's faults.
func errKind(ctx context.Context, err error, fallback string) string {
	switch {
	case errors.Is(err, errStreamError):
		return "stream_error"
	case errors.Is(err, errTruncated):
		return "truncated"
	case errors.Is(err, errBadChunk):
		return "bad_chunk"
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case ctx.Err() != nil:
		return "canceled"
	}
	return fallback
}

// errorMessage digs the message out of an OpenAI error body, or returns the
// body as it came.
func errorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(string(body))
}
