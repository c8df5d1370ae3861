package openai

import (
	"strings"
	"testing"
)

// feed writes in to a counter of api in reads of n bytes.
func feed(api API, in string, n int) *EventCounter {
	c := &EventCounter{API: api}
	for len(in) > 0 {
		k := min(n, len(in))
		_, _ = c.Write([]byte(in[:k]))
		in = in[k:]
	}
	return c
}

// TestStreamEnd: the end of each API's stream is seen however the reads
// cut it, and only at the very end.
func TestStreamEnd(t *testing.T) {
	chat := strings.Repeat("data: {\"choices\":[{}]}\n\n", 3)
	resp := "event: response.created\ndata: {\"type\":\"response.created\"}\n\n" +
		"event: response.output_text.delta\ndata: {\"delta\":\"a\"}\n\n"
	msgs := "event: message_start\ndata: {\"type\":\"message_start\"}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n"
	tests := []struct {
		api  API
		in   string
		want bool
	}{
		{Chat, chat + "data: [DONE]\n\n", true},
		{Chat, chat + "data: [DONE]\r\n\r\n", true},
		{Chat, "data: [DONE]\n\n", true},
		{Completions, chat + "data:[DONE]\n\n", true},
		{Chat, chat + "data: [DONE]\n", false},
		{Chat, chat + "data: [DONE]\n\ndata: {}\n\n", false},
		{Chat, chat + "data: [DONE]\n\nda", false},
		{Chat, chat, false},
		{Chat, "", false},
		{Responses, resp + "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{}}}\n\n", true},
		{Responses, resp + "event: response.incomplete\ndata: {}\r\n\r\n", true},
		{Responses, resp + "event: response.completed\ndata: {\"type\":\"response.completed\"}\n", false},
		{Responses, resp, false},
		{Responses, resp + "data: [DONE]\n\n", false},
		{Messages, msgs + "event: message_delta\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{Messages, msgs + "event: error\ndata: {\"type\":\"error\"}\n\n", true},
		{Messages, msgs + "event: message_delta\ndata: {}\n\n", false},
		{Messages, msgs + "event: message_stop\ndata: {}\n\nevent: ping\n", false},
	}
	for _, tt := range tests {
		for n := 1; n <= len(tt.in)+1; n++ {
			if got := feed(tt.api, tt.in, n).Ended(); got != tt.want {
				t.Fatalf("%s %q in reads of %d: ended %v, want %v", tt.api, tt.in, n, got, tt.want)
			}
		}
	}
}

// TestEventCounts: a cut stream's tokens are its data lines for OpenAI's
// chat and completions (a partial last one included), its delta events for
// the Responses API and content_block_delta for Anthropic's, each once its
// name line reached the client.
func TestEventCounts(t *testing.T) {
	tests := []struct {
		api  API
		in   string
		want int
	}{
		{Chat, "data: {\"role\":1}\n\ndata: {\"c\":\"a\"}\n\ndata: {\"c\":\"b", 3},
		{Chat, ": comment\n\ndata: {}\n\n", 1},
		{Responses, "event: response.created\ndata: {}\n\nevent: response.output_text.delta\ndata: {}\n\n" +
			"event: response.reasoning_text.delta\ndata: {}\n\nevent: response.output_text.done\ndata: {}\n\n" +
			"event: response.function_call_arguments.delta\ndata: {}\n\nevent: response.output_text.delta\ndata: {", 4},
		{Messages, "event: message_start\ndata: {}\n\nevent: content_block_start\ndata: {}\n\n" +
			"event: content_block_delta\ndata: {}\n\nevent: content_block_delta\ndata: {}\r\n\r\nevent: ping\ndata: {}\n\n", 2},
	}
	for _, tt := range tests {
		for n := 1; n <= len(tt.in)+1; n++ {
			if got := feed(tt.api, tt.in, n).Events; got != tt.want {
				t.Fatalf("%s %q in reads of %d: %d events, want %d", tt.api, tt.in, n, got, tt.want)
			}
		}
	}
}
