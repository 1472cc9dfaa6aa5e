package main

// One shared ticker writes every open stream's due chunk (as mock/ticker.py): a stream's
// token deadlines are first token + i × tok, each rounded up to the next tick, so no token
// is early and none drifts. Chunks are written with one write(2) on the connection's
// non-blocking socket; what a full socket does not take is kept and written first on a
// later tick, and no new token is written before it (the mock's back-pressure pause).

import (
	"sync"
	"syscall"
	"time"
)

type stream struct {
	fd      int
	prefix  []byte // a token line up to the content's string
	n, i    int    // tokens in all; the next one to write
	tok     time.Duration
	due     time.Time // the next token's deadline (not rounded)
	tail    []byte    // the final line's chunk and the end of the body
	pending []byte    // bytes a full socket did not take yet
	done    chan error
}

type wheel struct {
	mu      sync.Mutex
	tick    time.Duration
	base    time.Time
	buckets map[int64][]*stream
	next    int64  // the first tick not processed yet
	scratch []byte // one chunk being written
	spare   [][]*stream
}

func newWheel(tick time.Duration) *wheel {
	return &wheel{tick: tick, base: time.Now(), buckets: map[int64][]*stream{}, scratch: make([]byte, 0, 1024)}
}

// start writes the stream's first token now (its deadline: TTFT is not rounded to a tick)
// and files it for the next one.
func (w *wheel) start(s *stream) {
	w.mu.Lock()
	w.step(s)
	w.mu.Unlock()
}

func (w *wheel) run() {
	t := time.NewTicker(w.tick)
	defer t.Stop()
	for now := range t.C {
		k := int64(now.Sub(w.base) / w.tick)
		w.mu.Lock()
		first := w.next
		w.next = k + 1 // what is filed from here on goes to a later tick
		for t := first; t <= k; t++ {
			bucket, ok := w.buckets[t]
			if !ok {
				continue
			}
			delete(w.buckets, t)
			for _, s := range bucket {
				w.step(s)
			}
			w.spare = append(w.spare, bucket[:0])
		}
		w.mu.Unlock()
	}
}

// step writes what is due on s: its pending bytes, then its next token or its tail.
func (w *wheel) step(s *stream) {
	if len(s.pending) > 0 {
		n, err := write(s.fd, s.pending)
		if err != nil {
			s.done <- err
			return
		}
		s.pending = s.pending[n:]
		if len(s.pending) > 0 {
			w.file(s, w.next)
			return
		}
	}
	if s.i < s.n {
		w.scratch = s.token(w.scratch[:0], s.i)
		s.i++
		s.due = s.due.Add(s.tok)
		if err := w.send(s, w.scratch); err != nil {
			s.done <- err
			return
		}
		d := s.due.Sub(w.base)
		w.file(s, int64((d+w.tick-1)/w.tick))
		return
	}
	if err := w.send(s, s.tail); err != nil {
		s.done <- err
		return
	}
	if len(s.pending) > 0 {
		s.tail = nil
		w.file(s, w.next)
		return
	}
	s.done <- nil
}

func (w *wheel) send(s *stream, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	n, err := write(s.fd, data)
	if err != nil {
		return err
	}
	if n < len(data) {
		s.pending = append([]byte(nil), data[n:]...)
	}
	return nil
}

func (w *wheel) file(s *stream, tick int64) {
	if tick < w.next {
		tick = w.next
	}
	bucket, ok := w.buckets[tick]
	if !ok && len(w.spare) > 0 {
		bucket = w.spare[len(w.spare)-1]
		w.spare = w.spare[:len(w.spare)-1]
	}
	w.buckets[tick] = append(bucket, s)
}

// write: one non-blocking write(2); a full socket takes 0 bytes, not an error.
func write(fd int, data []byte) (int, error) {
	for {
		n, err := rawWrite(fd, data)
		switch err {
		case nil:
			return n, nil
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return 0, nil
		}
		return 0, err
	}
}
