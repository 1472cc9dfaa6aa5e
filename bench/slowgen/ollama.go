package main

// The bytes: as mock/formats.py writes them (Chunker.token, Chunker.tail, the GET routes).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// mock/text.py's WORDS: token i is WORDS[i % 16] + " ".
var words = []string{"lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit",
	"sed", "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et"}

const streamHead = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/x-ndjson\r\n"

// isoNow is Ollama's created_at as mock/ writes it (Python's isoformat, microseconds, Z).
func isoNow(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }

// newStream reads what the answer depends on from the request body (the model, num_predict)
// and returns the stream and the response head to write now.
func newStream(fd int, req *request, cfg *serveConfig, arrived time.Time) (*stream, []byte) {
	model := jsonString(req.body, "model")
	if model == "" {
		model = cfg.models[0]
	}
	n, reason := cfg.tokens, "stop"
	if limit, ok := jsonInt(req.body, "num_predict"); ok && limit >= 0 && limit < cfg.tokens {
		n, reason = limit, "length"
	}
	quoted, _ := json.Marshal(model)
	prefix := `{"model":` + string(quoted) + `,"created_at":"` + isoNow(arrived) +
		`","message":{"role":"assistant","content":`
	promptNs := cfg.ttft.Nanoseconds()
	evalNs := cfg.tok.Nanoseconds() * int64(n)
	// The prompt of bench/slowload.request_bytes ("<user>Why is the sky blue?\n") is 7 tokens.
	tail := fmt.Sprintf(`{"model": %s, "created_at": "%s", "message": {"role": "assistant", "content": ""}, `+
		`"done": true, "done_reason": "%s", "total_duration": %d, "load_duration": 0, `+
		`"prompt_eval_count": 7, "prompt_eval_duration": %d, "eval_count": %d, "eval_duration": %d}`+"\n",
		quoted, isoNow(arrived.Add(cfg.ttft+time.Duration(evalNs))), reason, promptNs+evalNs, promptNs, n, evalNs)
	s := &stream{fd: fd, prefix: []byte(prefix), n: n, tok: cfg.tok, due: arrived.Add(cfg.ttft),
		tail: append(chunk(nil, []byte(tail)), "0\r\n\r\n"...), done: make(chan error, 1)}
	head := streamHead + "\r\n"
	if req.close {
		head = streamHead + "Connection: close\r\n\r\n"
	}
	return s, []byte(head)
}

// token appends token i's chunk (chunked framing included) to dst.
func (s *stream) token(dst []byte, i int) []byte {
	w := words[i%len(words)]
	size := len(s.prefix) + len(w) + 3 + len(`},"done":false}`) + 1
	dst = strconv.AppendInt(dst, int64(size), 16)
	dst = append(dst, "\r\n"...)
	dst = append(dst, s.prefix...)
	dst = append(dst, '"')
	dst = append(dst, w...)
	dst = append(dst, ` "},"done":false}`...)
	return append(dst, "\n\r\n"...)
}

func chunk(dst, data []byte) []byte {
	dst = strconv.AppendInt(dst, int64(len(data)), 16)
	dst = append(dst, "\r\n"...)
	dst = append(dst, data...)
	return append(dst, "\r\n"...)
}

// jsonString: the string value of the first `"key"` in body ("" if none or escaped).
func jsonString(body []byte, key string) string {
	v := jsonValue(body, key)
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	end := bytes.IndexByte(v[1:], '"')
	if end < 0 || bytes.IndexByte(v[1:1+end], '\\') >= 0 {
		return ""
	}
	return string(v[1 : 1+end])
}

// jsonInt: the integer value of the first `"key"` in body.
func jsonInt(body []byte, key string) (int, bool) {
	v := jsonValue(body, key)
	end := 0
	for end < len(v) && (v[end] == '-' || v[end] >= '0' && v[end] <= '9') {
		end++
	}
	n, err := strconv.Atoi(string(v[:end]))
	return n, err == nil
}

// jsonValue: the bytes after `"key"`, whitespace and ':' (nil if the key is absent). The
// request bodies here are small and flat enough for a search.
func jsonValue(body []byte, key string) []byte {
	i := bytes.Index(body, []byte(`"`+key+`"`))
	if i < 0 {
		return nil
	}
	v := bytes.TrimLeft(body[i+len(key)+2:], " \t\r\n")
	if len(v) == 0 || v[0] != ':' {
		return nil
	}
	return bytes.TrimLeft(v[1:], " \t\r\n")
}

func getReply(path string, cfg *serveConfig) []byte {
	now := time.Now()
	const digest = "5a5947544aa8a0ac967cdd1487bda9a62199a99410bf30ba899b75330d3fd2ad"
	const details = `"details": {"parent_model": "", "format": "gguf", "family": "%s", "families": ["%s"], ` +
		`"parameter_size": "8.0B", "quantization_level": "Q4_K_M"}`
	var items []string
	for _, m := range cfg.models {
		name := m
		if !bytes.Contains([]byte(m), []byte(":")) {
			name = m + ":latest"
		}
		family := string(bytes.SplitN([]byte(m), []byte(":"), 2)[0])
		d := fmt.Sprintf(details, family, family)
		switch path {
		case "/api/tags":
			items = append(items, fmt.Sprintf(`{"name": "%s", "model": "%s", "modified_at": "%s", "size": 4920000000, `+
				`"digest": "%s", %s}`, name, name, isoNow(now), digest, d))
		case "/api/ps":
			items = append(items, fmt.Sprintf(`{"name": "%s", "model": "%s", "size": 5500000000, "digest": "%s", %s, `+
				`"expires_at": "%s", "size_vram": 5500000000, "context_length": 8192}`,
				name, name, digest, d, isoNow(now.Add(5*time.Minute))))
		case "/v1/models":
			items = append(items, fmt.Sprintf(`{"id": "%s", "object": "model", "created": %d, "owned_by": "mock"}`,
				m, now.Unix()))
		}
	}
	list := "[" + string(bytes.Join(toBytes(items), []byte(", "))) + "]"
	switch path {
	case "/api/version":
		return reply(200, `{"version": "0.12.6"}`)
	case "/api/tags", "/api/ps":
		return reply(200, `{"models": `+list+`}`)
	case "/v1/models":
		return reply(200, `{"object": "list", "data": `+list+`}`)
	}
	return reply(404, `{"error": "not found"}`)
}

func toBytes(items []string) [][]byte {
	out := make([][]byte, len(items))
	for i, s := range items {
		out[i] = []byte(s)
	}
	return out
}
