package main

// An HTTP/1.1 response parser for one stream at a time, fed the bytes of each read:
// the status, chunked or Content-Length bodies, keep-alive. Per body piece it only counts
// newlines and bytes, keeps the last 512 bytes (for the final line), and looks for the
// first non-empty token until it found one (bench/slowload.py does the same in Python).

import (
	"bytes"
	"errors"
	"strconv"
)

const (
	stHead = iota
	stSize
	stData
	stDataEnd
	stTrailer
	stLength
	stDone
)

type respParser struct {
	state     int
	line      []byte // the head, or a chunk-size or trailer line, being accumulated
	status    int
	chunked   bool
	close     bool
	left      int // bytes left in this chunk or Content-Length body
	lines     int
	nbytes    int
	tail      []byte
	sawToken  bool // a body piece carried a non-empty token
	lastToken bool // ... and it was in the latest feed
}

var errProtocol = errors.New("protocol")

func (p *respParser) reset() {
	*p = respParser{line: p.line[:0], tail: p.tail[:0]}
}

func (p *respParser) done() bool { return p.state == stDone }

// feed consumes data; it returns how many bytes belong to this response (the rest would be
// the next one's: never, one request at a time).
func (p *respParser) feed(data []byte) (int, error) {
	p.lastToken = false
	i := 0
	for i < len(data) && p.state != stDone {
		switch p.state {
		case stHead:
			p.line = append(p.line, data[i:]...)
			end := bytes.Index(p.line, []byte("\r\n\r\n"))
			if end < 0 {
				if len(p.line) > 64<<10 {
					return i, errProtocol
				}
				return len(data), nil
			}
			used := len(data) - i - (len(p.line) - end - 4)
			if err := p.head(p.line[:end]); err != nil {
				return i, err
			}
			p.line = p.line[:0]
			i += used
		case stSize, stTrailer:
			nl := bytes.IndexByte(data[i:], '\n')
			if nl < 0 {
				p.line = append(p.line, data[i:]...)
				return len(data), nil
			}
			p.line = append(p.line, data[i:i+nl]...)
			i += nl + 1
			line := bytes.TrimRight(p.line, "\r")
			p.line = p.line[:0]
			if p.state == stTrailer {
				if len(line) == 0 {
					p.state = stDone
				}
				continue
			}
			if semi := bytes.IndexByte(line, ';'); semi >= 0 {
				line = line[:semi]
			}
			n, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 32)
			if err != nil || n < 0 {
				return i, errProtocol
			}
			p.left = int(n)
			p.state = stData
			if n == 0 {
				p.state = stTrailer
			}
		case stData, stLength:
			n := min(p.left, len(data)-i)
			p.body(data[i : i+n])
			i += n
			p.left -= n
			if p.left == 0 {
				if p.state == stLength {
					p.state = stDone
				} else {
					p.state = stDataEnd
				}
			}
		case stDataEnd: // the CRLF after a chunk's data
			if data[i] == '\n' {
				p.state = stSize
			} else if data[i] != '\r' {
				return i, errProtocol
			}
			i++
		}
	}
	return i, nil
}

func (p *respParser) head(h []byte) error {
	lines := bytes.Split(h, []byte("\r\n"))
	status := bytes.SplitN(lines[0], []byte(" "), 3)
	if len(status) < 2 || !bytes.HasPrefix(status[0], []byte("HTTP/1.")) {
		return errProtocol
	}
	code, err := strconv.Atoi(string(status[1]))
	if err != nil {
		return errProtocol
	}
	p.status = code
	p.close = bytes.Equal(status[0], []byte("HTTP/1.0"))
	length := -1
	for _, line := range lines[1:] {
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("transfer-encoding")):
			p.chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
		case bytes.EqualFold(name, []byte("content-length")):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 {
				return errProtocol
			}
		case bytes.EqualFold(name, []byte("connection")):
			p.close = bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case p.chunked:
		p.state = stSize
	case length > 0:
		p.state, p.left = stLength, length
	case length == 0:
		p.state = stDone
	default:
		return errProtocol // close-delimited bodies: not from the mock nor the router
	}
	return nil
}

func (p *respParser) body(piece []byte) {
	if !p.sawToken && hasToken(piece) {
		p.sawToken, p.lastToken = true, true
	}
	p.lines += bytes.Count(piece, []byte("\n"))
	p.nbytes += len(piece)
	const keep = 512
	if len(piece) >= keep {
		p.tail = append(p.tail[:0], piece[len(piece)-keep:]...)
		return
	}
	if over := len(p.tail) + len(piece) - keep; over > 0 {
		p.tail = p.tail[:copy(p.tail, p.tail[over:])]
	}
	p.tail = append(p.tail, piece...)
}

// finalDone: the body's last line says `"done": true`.
func (p *respParser) finalDone() bool {
	t := bytes.TrimRight(p.tail, "\n")
	if nl := bytes.LastIndexByte(t, '\n'); nl >= 0 {
		t = t[nl+1:]
	}
	v := jsonValue(t, "done")
	return bytes.HasPrefix(v, []byte("true"))
}

// hasToken: `"content"`, `"response"` or `"text"`, then ':' and a non-empty string.
func hasToken(piece []byte) bool {
	for _, key := range [...]string{`"content"`, `"response"`, `"text"`} {
		rest := piece
		for {
			i := bytes.Index(rest, []byte(key))
			if i < 0 {
				break
			}
			rest = rest[i+len(key):]
			v := bytes.TrimLeft(rest, " \t")
			if len(v) > 0 && v[0] == ':' {
				v = bytes.TrimLeft(v[1:], " \t")
				if len(v) > 1 && v[0] == '"' && v[1] != '"' {
					return true
				}
			}
		}
	}
	return false
}
