// Package openai is what the router knows of the wire formats it serves
// (design §7.1): OpenAI's chat, completions, embeddings and Responses
// APIs and Anthropic's Messages API, each an API value. It holds the few
// fields the router reads of a request (SniffFor), the ones it edits in
// place (WithUsage, ForLlamaCpp, WithPriority), the usage chunk it strips
// from a stream it asked usage for (UsageStripper), the usage it reads
// back for metering and tier 2's accounting (UsageFor), the events of a
// stream it counts and whose end it watches (EventCounter), and the error
// body every refusal is sent in (Error; Anthropic's on its API). It holds no state and does no I/O beyond
// the writer it is given, so the router's pipeline stages share one
// definition of each and can be tested without a network.
package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Error is an error the client sees, in OpenAI's shape (design §7.1), so
// the OpenAI SDKs surface it as they would OpenAI's own. Every stage of the
// router's pipeline refuses a request with one; the handler writes it.
type Error struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
	// RetryAfter, when positive, is sent as Retry-After (seconds).
	RetryAfter int
	// Allow is the 405's Allow header: the methods the path takes.
	Allow string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// InvalidJSON is the 400 for a body that is not a JSON object.
func InvalidJSON(err error) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_json",
		Message: "request body is not valid JSON: " + err.Error()}
}

// InvalidField is the 400 for a field the router reads or edits in the wrong
// shape; param names it, or is "" for the body as a whole.
func InvalidField(param, msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_value",
		Param: param, Message: msg}
}

// ModelNotFound is the 404 for a name that is neither a model nor an adapter.
func ModelNotFound(model string) *Error {
	return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
		Param: "model", Message: fmt.Sprintf("the model %q does not exist", model)}
}

// TooLarge is the 413 for a body over the router's limit.
func TooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: fmt.Sprintf("request body exceeds %d bytes", limit)}
}

// HeadersTooLarge is the 431 for a request with more header fields, or
// more header bytes, than the router takes; what names the limit passed.
func HeadersTooLarge(what string) *Error {
	return &Error{Status: http.StatusRequestHeaderFieldsTooLarge, Type: "invalid_request_error", Code: "headers_too_large",
		Message: "request headers exceed the router's limit: " + what}
}

// BodyTimeout is the 408 for a body that did not arrive in time.
func BodyTimeout() *Error {
	return &Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
		Message: "the request body did not arrive in time"}
}

// Overloaded is the 503 for a request beyond the router's in-flight limit;
// the client retries after retryAfter seconds, most likely on a router
// with room.
func Overloaded(limit, retryAfter int) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "router_overloaded",
		Message: fmt.Sprintf("the router is serving its limit of %d requests; retry shortly", limit), RetryAfter: retryAfter}
}

// CallerBusy is the 429 for a request past the in-flight bound of one
// caller (--max-key-inflight): an API key, or a client address while keys
// are not required (who says which). OpenAI's rate-limit shape, so the
// SDKs back off and retry as they do for OpenAI's own 429s.
func CallerBusy(who string, limit, retryAfter int) *Error {
	return &Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded",
		Message: fmt.Sprintf("%s already has %d requests in flight, the most this router serves one caller at once (max_key_inflight); retry once one has finished",
			who, limit), RetryAfter: retryAfter}
}

// NoReplica is the 503 for a model no replica can take a request of now.
func NoReplica(model string) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_replica_available",
		Message: fmt.Sprintf("no replica of %q is ready; retry shortly", model), RetryAfter: 1}
}

// Upstream is the 502 for a request every replica tried failed before answering.
func Upstream(err error) *Error {
	return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_error",
		Message: "the engine failed: " + err.Error()}
}

// MethodNotAllowed is the 405 for a path that takes only the methods in
// allow (comma-separated, as the Allow header lists them).
func MethodNotAllowed(method, path, allow string) *Error {
	return &Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: fmt.Sprintf("%s %s is not allowed; use %s", method, path, allow), Allow: allow}
}

// UnknownPath is the 404 for a path the router does not serve, in
// OpenAI's words for one, so the SDKs show it rather than an empty error.
func UnknownPath(method, path string) *Error {
	return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
		Message: fmt.Sprintf("Invalid URL (%s %s)", method, path)}
}

// WrongTask is the 400 for a model sent to an endpoint of the other task:
// an embedding model (task embed) to a completion endpoint, or a
// generating one to /v1/embeddings; use names the endpoints it serves.
func WrongTask(model, task, path, use string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "model_not_supported",
		Param: "model", Message: fmt.Sprintf("the model %q (task %s) does not serve %s; use %s", model, task, path, use)}
}

type errorBody struct {
	Error errorFields `json:"error"`
}

type errorFields struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// AdapterCold is the 503 for an adapter no replica the request may go to
// holds, for the reason why (with Retry-After when retryAfter is positive).
func AdapterCold(adapter, why string, retryAfter int) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "adapter_unavailable",
		Message: fmt.Sprintf("the adapter %q is not loaded: %s", adapter, why), RetryAfter: retryAfter}
}

// WriteError sends e (or a 500 for any other error) as OpenAI's error body.
func WriteError(w http.ResponseWriter, err error) {
	e := asError(err)
	body := errorBody{Error: errorFields{Message: e.Message, Type: e.Type}}
	if e.Param != "" {
		body.Error.Param = &e.Param
	}
	if e.Code != "" {
		body.Error.Code = &e.Code
	}
	writeHead(w, e)
	_ = json.NewEncoder(w).Encode(body)
}

// WriteErrorFor sends e in the error body of the API the request was sent
// to: Anthropic's for /v1/messages and its count_tokens, so Anthropic's SDKs
// raise their own typed errors, OpenAI's for the rest.
func WriteErrorFor(w http.ResponseWriter, api API, err error) {
	if api.Anthropic() {
		WriteAnthropicError(w, err)
		return
	}
	WriteError(w, err)
}

// WriteErrorAt is WriteErrorFor for a request that may not have reached an
// API: the shape is chosen by path, Anthropic's for every path under
// /v1/messages (an unknown one included), OpenAI's for the rest.
func WriteErrorAt(w http.ResponseWriter, path string, err error) {
	if path == PathMessages || strings.HasPrefix(path, PathMessages+"/") {
		WriteAnthropicError(w, err)
		return
	}
	WriteError(w, err)
}

// anthropicBody is Anthropic's error body, as vLLM's /v1/messages sends it
// too (vllm/entrypoints/anthropic/protocol.py AnthropicErrorResponse):
// {"type":"error","error":{"type":...,"message":...}}.
type anthropicBody struct {
	Type  string         `json:"type"`
	Error anthropicError `json:"error"`
}

type anthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// WriteAnthropicError sends e (or a 500 for any other error) as Anthropic's
// error body. The type is Anthropic's name for the status (AnthropicType);
// OpenAI's code, which Anthropic's body has no field for, is kept at the
// head of the message so nothing the OpenAI body would say is lost.
func WriteAnthropicError(w http.ResponseWriter, err error) {
	e := asError(err)
	msg := e.Message
	if e.Code != "" {
		msg = e.Code + ": " + msg
	}
	writeHead(w, e)
	_ = json.NewEncoder(w).Encode(anthropicBody{Type: "error", Error: anthropicError{Type: AnthropicType(e.Status), Message: msg}})
}

// AnthropicType is Anthropic's error type for an HTTP status
// (docs.anthropic.com "Errors"): the types its SDKs map to their error
// classes.
func AnthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusRequestTimeout, http.StatusRequestHeaderFieldsTooLarge:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

func asError(err error) *Error {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
	}
	return e
}

// writeHead writes an error's status and headers.
func writeHead(w http.ResponseWriter, e *Error) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.Allow != "" {
		h.Set("Allow", e.Allow)
	}
	if e.RetryAfter > 0 {
		h.Set("Retry-After", fmt.Sprint(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
}
