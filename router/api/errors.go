package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// apiError is an error the client sees, in OpenAI's shape (plan §7.1), so
// the OpenAI SDKs surface it as they would OpenAI's own.
type apiError struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
	// RetryAfter, when positive, is sent as Retry-After (seconds).
	RetryAfter int
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

func errInvalidJSON(err error) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_json",
		Message: "request body is not valid JSON: " + err.Error()}
}

func errInvalidField(param, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_value",
		Param: param, Message: msg}
}

func errModelNotFound(model string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
		Param: "model", Message: fmt.Sprintf("the model %q does not exist", model)}
}

func errTooLarge(limit int64) *apiError {
	return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: fmt.Sprintf("request body exceeds %d bytes", limit)}
}

func errNoReplica(model string) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_replica_available",
		Message: fmt.Sprintf("no replica of %q is ready; retry shortly", model), RetryAfter: 1}
}

func errUpstream(err error) *apiError {
	return &apiError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_error",
		Message: "the engine failed: " + err.Error()}
}

func errMethod(allow string) *apiError {
	return &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: "use " + allow}
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

// writeError sends e (or a 500 for any other error) as OpenAI's error body.
func writeError(w http.ResponseWriter, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		e = &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
	}
	body := errorBody{Error: errorFields{Message: e.Message, Type: e.Type}}
	if e.Param != "" {
		body.Error.Param = &e.Param
	}
	if e.Code != "" {
		body.Error.Code = &e.Code
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.Status == http.StatusMethodNotAllowed {
		h.Set("Allow", http.MethodPost)
	}
	if e.RetryAfter > 0 {
		h.Set("Retry-After", fmt.Sprint(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(body)
}
