/* The relay's compiled fast path (for slow streams): see pump.py.
 *
 * A Pump owns one epoll set, which the event loop watches as a single reader. Each relayed
 * stream registers its backend socket there (a dup of the fd uvloop owns, whose reading is
 * paused meanwhile). When a backend socket is readable, run() reads it, decodes HTTP/1.1
 * chunked framing, keeps the payload's whole records (or all of it without a separator),
 * and writes them to the client's socket as one chunk — what relay.Records.take writes from
 * Python, without a Python call per chunk. Anything else is reported to Python as an event:
 * the body's end, a cut or malformed body, a client that cannot be written to, and the
 * forwarded bytes to keep (continuation.Sent) once enough have gathered.
 *
 * A client that pushes back is waited for here (EPOLLOUT on a dup of its fd) while the
 * backend's socket is not read: back-pressure reaches the backend as in the Python path.
 *
 * A record's beginning waits in `pending` for its end. Each read is scanned once (from where
 * the last scan stopped), and a record that waits, or ends, longer than the stream's
 * `record_limit` (max_record_bytes) ends the stream (EV_LONG) instead of growing `pending`
 * without bound: a hostile 200 MiB line once made it 768 MB. Buffers a long record grew are
 * given back once it is gone.
 *
 * The backend's error record (`{"error": ...}` inside a 200 stream: a crashed model runner,
 * relay/error_record.py) is never written here: the records about to be written are
 * searched for `"error"` (memmem, each byte once, when it is written), and only when that
 * trips is the stream's Python `check` asked where an error record starts among them. The
 * records before it are written; the stream ends with EV_ERROR and the record waits in
 * `pending` for Python, which resumes the stream elsewhere or relays the record.
 *
 * `blocked(handle)` tells Python whether a stream that made no progress is waiting for the
 * client's socket (the client stopped reading: its fault, not the backend's). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum { S_SIZE, S_EXT, S_SIZE_LF, S_DATA, S_DATA_CR, S_DATA_LF, S_TRAILER, S_TRAILER_LINE, S_END_LF, S_DONE };
enum { EV_END = 1, EV_END_DIRTY = 2, EV_CUT = 3, EV_BAD = 4, EV_CLIENT = 5, EV_SENT = 6, EV_LONG = 7, EV_ERROR = 8 };

#define READ_SIZE 65536
#define MAX_EVENTS 256

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static int buf_add(buf_t *b, const char *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        char *q = realloc(b->p, cap);
        if (q == NULL) return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static void buf_drop(buf_t *b, size_t n) { /* the first n bytes */
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->p, b->p + n, b->len - n);
        b->len -= n;
    }
}

/* A buffer a long record grew is given back once mostly empty (else every stream that once
 * carried one would keep its peak). */
static void buf_fit(buf_t *b) {
    if (b->cap <= 4 * READ_SIZE || b->len > b->cap / 4) return;
    size_t cap = 256;
    while (cap < b->len) cap *= 2;
    char *q = realloc(b->p, cap);
    if (q != NULL) {
        b->p = q;
        b->cap = cap;
    }
}

static void buf_free(buf_t *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

typedef struct {
    int up, client;     /* our dups of the backend's and the client's sockets */
    int state;
    uint64_t size;      /* the chunk's size being read (S_SIZE), then what is left of it (S_DATA) */
    int digits;
    int dirty;          /* trailers or bytes after the body: the connection is not reused */
    int blocked;        /* waiting for the client's socket to take `out` */
    int done;           /* a final event was reported: nothing more is done */
    int sent_flagged;   /* EV_SENT reported, not yet taken */
    double last;        /* CLOCK_MONOTONIC seconds of the last progress (a read or a flush) */
    size_t scanned;     /* pending[:scanned] holds no separator */
    size_t sent_limit;
    size_t record_limit; /* a record longer than this ends the stream (EV_LONG); 0: none */
    char sep[4];
    int seplen;
    buf_t pending;      /* payload not yet written: a record's beginning */
    buf_t out;          /* framed bytes the client's socket did not take yet */
    buf_t sent;         /* payload written, not yet taken by Python */
    PyObject *check;    /* check(records) -> where an error record starts in them, or -1; NULL: none */
} stream_t;

typedef struct {
    PyObject_HEAD
    int ep;
    stream_t **streams;
    Py_ssize_t nstreams;
} Pump;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decode `n` bytes of chunked framing into s->pending. 0, or EV_BAD. */
static int decode(stream_t *s, const char *d, size_t n) {
    size_t i = 0;
    while (i < n) {
        char c = d[i];
        switch (s->state) {
        case S_SIZE: {
            int v = hexval(c);
            if (v >= 0) {
                if (++s->digits > 15) return EV_BAD;
                s->size = s->size * 16 + (uint64_t)v;
            } else if (s->digits && (c == ';' || c == ' ' || c == '\t')) {
                s->state = S_EXT;
            } else if (s->digits && c == '\r') {
                s->state = S_SIZE_LF;
            } else {
                return EV_BAD;
            }
            i++;
            break;
        }
        case S_EXT:
            if (c == '\r') s->state = S_SIZE_LF;
            else if (c == '\n') return EV_BAD;
            i++;
            break;
        case S_SIZE_LF:
            if (c != '\n') return EV_BAD;
            s->state = s->size ? S_DATA : S_TRAILER;
            i++;
            break;
        case S_DATA: {
            size_t take = n - i;
            if ((uint64_t)take > s->size) take = (size_t)s->size;
            if (buf_add(&s->pending, d + i, take) < 0) return EV_BAD;
            s->size -= take;
            i += take;
            if (s->size == 0) s->state = S_DATA_CR;
            break;
        }
        case S_DATA_CR:
            if (c != '\r') return EV_BAD;
            s->state = S_DATA_LF;
            i++;
            break;
        case S_DATA_LF:
            if (c != '\n') return EV_BAD;
            s->state = S_SIZE;
            s->size = 0;
            s->digits = 0;
            i++;
            break;
        case S_TRAILER:
            if (c == '\r') {
                s->state = S_END_LF;
            } else if (c == '\n') { /* a bare LF ends the trailer section too (RFC 9112 2.2, as h11 reads it) */
                s->state = S_DONE;
                i++;
                if (i < n) s->dirty = 1;
                return 0;
            } else {
                s->dirty = 1;
                s->state = S_TRAILER_LINE;
            }
            i++;
            break;
        case S_TRAILER_LINE:
            if (c == '\n') s->state = S_TRAILER;
            i++;
            break;
        case S_END_LF:
            if (c != '\n') return EV_BAD;
            s->state = S_DONE;
            i++;
            if (i < n) s->dirty = 1; /* bytes after the answer */
            return 0;
        default:
            s->dirty = 1;
            return 0;
        }
    }
    return 0;
}

/* Write `iov` to the client, keeping what it did not take in s->out. 0, or EV_CLIENT. */
static int write_client(Pump *self, stream_t *s, Py_ssize_t h, struct iovec *iov, int cnt) {
    size_t total = 0;
    for (int k = 0; k < cnt; k++) total += iov[k].iov_len;
    ssize_t w = 0;
    if (!s->blocked) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = cnt;
        do {
            w = sendmsg(s->client, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        } while (w < 0 && errno == EINTR);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) return EV_CLIENT;
            w = 0;
        }
        if ((size_t)w == total) return 0;
    }
    /* keep the rest, in order */
    size_t skip = (size_t)w;
    for (int k = 0; k < cnt; k++) {
        if (skip >= iov[k].iov_len) {
            skip -= iov[k].iov_len;
            continue;
        }
        if (buf_add(&s->out, (char *)iov[k].iov_base + skip, iov[k].iov_len - skip) < 0) return EV_CLIENT;
        skip = 0;
    }
    if (!s->blocked) {
        struct epoll_event ev = {.events = 0, .data.u64 = ((uint64_t)h << 1)};
        epoll_ctl(self->ep, EPOLL_CTL_MOD, s->up, &ev); /* stop reading the backend */
        ev.events = EPOLLOUT;
        ev.data.u64 = ((uint64_t)h << 1) | 1;
        if (epoll_ctl(self->ep, EPOLL_CTL_ADD, s->client, &ev) < 0) return EV_CLIENT;
        s->blocked = 1;
    }
    return 0;
}

/* Just past the first separator at or after `from` in pending (0: none). */
static size_t first_end(stream_t *s, size_t from) {
    const char *p = s->pending.p;
    size_t len = s->pending.len, n = (size_t)s->seplen;
    while (from + n <= len) {
        const char *q = memchr(p + from, s->sep[0], len - from - n + 1);
        if (q == NULL) return 0;
        from = (size_t)(q - p);
        if (memcmp(q, s->sep, n) == 0) return from + n;
        from++;
    }
    return 0;
}

/* Python's check on pending[:end], which holds `"error"`: where an error record starts (-1:
 * none, or the check failed). */
static Py_ssize_t error_at(stream_t *s, size_t end) {
    PyObject *data = PyBytes_FromStringAndSize(s->pending.p, (Py_ssize_t)end);
    PyObject *r = data ? PyObject_CallOneArg(s->check, data) : NULL;
    Py_XDECREF(data);
    Py_ssize_t at = r ? PyLong_AsSsize_t(r) : -1;
    Py_XDECREF(r);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        at = -1;
    }
    return at >= 0 && (size_t)at <= end ? at : -1;
}

/* The whole records in pending (all of it without a separator) go to the client; EV_LONG
 * (nothing written) when a record waits, or ended, longer than record_limit; EV_ERROR (the
 * records before it written) when an error record is among them. */
static int emit(Pump *self, stream_t *s, Py_ssize_t h) {
    size_t end = s->pending.len;
    if (s->seplen) {
        size_t waited = s->scanned; /* bytes of a record that waited before this read */
        size_t from = s->scanned >= (size_t)s->seplen ? s->scanned - s->seplen + 1 : 0;
        end = 0;
        if (s->pending.len >= (size_t)s->seplen) {
            for (size_t j = s->pending.len - s->seplen + 1; j-- > from;) {
                if (memcmp(s->pending.p + j, s->sep, s->seplen) == 0) {
                    end = j + s->seplen;
                    break;
                }
            }
        }
        s->scanned = s->pending.len;
        size_t limit = s->record_limit;
        if (limit && s->pending.len > limit &&
            (s->pending.len - end > limit || (waited && end && first_end(s, from) > limit)))
            return EV_LONG;
    }
    if (end == 0) return 0;
    int ev = 0;
    if (s->check != NULL && end >= 7 && memmem(s->pending.p, end, "\"error\"", 7) != NULL) {
        Py_ssize_t at = error_at(s, end); /* rare: maybe the backend's error record */
        if (at >= 0) {
            end = (size_t)at;
            ev = EV_ERROR;
            if (end == 0) return ev;
        }
    }
    char head[24];
    int hl = snprintf(head, sizeof head, "%zx\r\n", end);
    struct iovec iov[3] = {{head, (size_t)hl}, {s->pending.p, end}, {"\r\n", 2}};
    int r = write_client(self, s, h, iov, 3);
    if (r) return r;
    if (buf_add(&s->sent, s->pending.p, end) < 0) return EV_CLIENT;
    buf_drop(&s->pending, end);
    buf_fit(&s->pending);
    s->scanned = s->pending.len;
    return ev;
}

static void unregister(Pump *self, stream_t *s) {
    if (s->up >= 0) {
        epoll_ctl(self->ep, EPOLL_CTL_DEL, s->up, NULL);
        close(s->up);
        s->up = -1;
    }
    if (s->client >= 0) {
        if (s->blocked) epoll_ctl(self->ep, EPOLL_CTL_DEL, s->client, NULL);
        close(s->client);
        s->client = -1;
    }
    s->blocked = 0;
}

/* A final event: the stream is left as it is until Python removes it. */
static int finish(Pump *self, stream_t *s, int ev) {
    s->done = 1;
    if (ev == EV_LONG) buf_free(&s->pending); /* (not relayed: not handed to Python either) */
    if (s->up >= 0) epoll_ctl(self->ep, EPOLL_CTL_DEL, s->up, NULL);
    if (s->blocked) {
        epoll_ctl(self->ep, EPOLL_CTL_DEL, s->client, NULL);
        s->blocked = 0;
    }
    return ev;
}

static int on_backend(Pump *self, stream_t *s, Py_ssize_t h, char *rbuf) {
    ssize_t r;
    do {
        r = read(s->up, rbuf, READ_SIZE);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return finish(self, s, EV_CUT);
    }
    if (r == 0) return finish(self, s, EV_CUT);
    s->last = now();
    int e = decode(s, rbuf, (size_t)r);
    if (e) return finish(self, s, e);
    e = emit(self, s, h);
    if (e) return finish(self, s, e);
    if (s->state == S_DONE) return finish(self, s, s->dirty ? EV_END_DIRTY : EV_END);
    return 0;
}

static int on_client(Pump *self, stream_t *s, Py_ssize_t h) {
    ssize_t w;
    do {
        w = send(s->client, s->out.p, s->out.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return finish(self, s, EV_CLIENT);
    }
    buf_drop(&s->out, (size_t)w);
    s->last = now();
    if (s->out.len) return 0;
    buf_fit(&s->out);
    epoll_ctl(self->ep, EPOLL_CTL_DEL, s->client, NULL);
    s->blocked = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ((uint64_t)h << 1)};
    if (epoll_ctl(self->ep, EPOLL_CTL_MOD, s->up, &ev) < 0) return finish(self, s, EV_CUT);
    return 0;
}

static stream_t *get(Pump *self, Py_ssize_t h) {
    if (h < 0 || h >= self->nstreams || self->streams[h] == NULL) {
        PyErr_SetString(PyExc_KeyError, "no such stream");
        return NULL;
    }
    return self->streams[h];
}

static PyObject *Pump_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Pump *self = (Pump *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->ep = epoll_create1(EPOLL_CLOEXEC);
    if (self->ep < 0) {
        Py_DECREF(self);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return (PyObject *)self;
}

static void free_stream(Pump *self, Py_ssize_t h) {
    stream_t *s = self->streams[h];
    if (s == NULL) return;
    unregister(self, s);
    buf_free(&s->pending);
    buf_free(&s->out);
    buf_free(&s->sent);
    Py_CLEAR(s->check);
    free(s);
    self->streams[h] = NULL;
}

static PyObject *Pump_close(Pump *self, PyObject *unused) {
    for (Py_ssize_t h = 0; h < self->nstreams; h++) free_stream(self, h);
    free(self->streams);
    self->streams = NULL;
    self->nstreams = 0;
    if (self->ep >= 0) close(self->ep);
    self->ep = -1;
    Py_RETURN_NONE;
}

static void Pump_dealloc(Pump *self) {
    Py_XDECREF(Pump_close(self, NULL));
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Pump_fileno(Pump *self, PyObject *unused) { return PyLong_FromLong(self->ep); }

/* add(backend_fd, client_fd, sep, pending, sent_limit, record_limit=0, check=None) -> handle.
 * `pending`: a record's beginning, which holds no separator. `check`: see error_at. */
static PyObject *Pump_add(Pump *self, PyObject *args) {
    int up, client;
    const char *sep, *pending;
    Py_ssize_t seplen, plen, limit, record_limit = 0;
    PyObject *check = Py_None;
    if (!PyArg_ParseTuple(args, "iiy#y#n|nO", &up, &client, &sep, &seplen, &pending, &plen, &limit, &record_limit,
                          &check))
        return NULL;
    if (seplen > 4 || record_limit < 0) {
        PyErr_SetString(PyExc_ValueError, "sep: at most 4 bytes; record_limit: >= 0");
        return NULL;
    }
    if (self->ep < 0) {
        PyErr_SetString(PyExc_ValueError, "closed");
        return NULL;
    }
    Py_ssize_t h = 0;
    while (h < self->nstreams && self->streams[h] != NULL) h++;
    if (h == self->nstreams) {
        Py_ssize_t n = self->nstreams ? self->nstreams * 2 : 64;
        stream_t **grown = realloc(self->streams, n * sizeof *grown);
        if (grown == NULL) return PyErr_NoMemory();
        memset(grown + self->nstreams, 0, (n - self->nstreams) * sizeof *grown);
        self->streams = grown;
        self->nstreams = n;
    }
    stream_t *s = calloc(1, sizeof *s);
    if (s == NULL) return PyErr_NoMemory();
    s->up = fcntl(up, F_DUPFD_CLOEXEC, 0);
    s->client = fcntl(client, F_DUPFD_CLOEXEC, 0);
    self->streams[h] = s;
    if (check != Py_None) {
        Py_INCREF(check);
        s->check = check;
    }
    memcpy(s->sep, sep, seplen);
    s->seplen = (int)seplen;
    s->sent_limit = (size_t)limit;
    s->record_limit = (size_t)record_limit;
    s->state = S_SIZE;
    s->last = now();
    s->scanned = (size_t)plen; /* (no separator in it: not scanned again) */
    if (s->up < 0 || s->client < 0 || (plen && buf_add(&s->pending, pending, plen) < 0)) {
        PyErr_SetFromErrno(PyExc_OSError);
        free_stream(self, h);
        return NULL;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ((uint64_t)h << 1)};
    if (epoll_ctl(self->ep, EPOLL_CTL_ADD, s->up, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        free_stream(self, h);
        return NULL;
    }
    return PyLong_FromSsize_t(h);
}

/* run(most) -> [(handle, event), ...]: relay what is ready now, at most `most` sockets. */
static PyObject *Pump_run(Pump *self, PyObject *arg) {
    static char rbuf[READ_SIZE];
    struct epoll_event evs[MAX_EVENTS];
    long most = PyLong_AsLong(arg);
    if (most == -1 && PyErr_Occurred()) return NULL;
    if (most < 1 || most > MAX_EVENTS) most = MAX_EVENTS;
    PyObject *out = PyList_New(0);
    if (out == NULL || self->ep < 0) return out;
    int n;
    do {
        n = epoll_wait(self->ep, evs, (int)most, 0);
    } while (n < 0 && errno == EINTR);
    for (int k = 0; k < n; k++) {
        Py_ssize_t h = (Py_ssize_t)(evs[k].data.u64 >> 1);
        if (h >= self->nstreams || self->streams[h] == NULL) continue;
        stream_t *s = self->streams[h];
        if (s->done) continue;
        int e = (evs[k].data.u64 & 1) ? on_client(self, s, h) : on_backend(self, s, h, rbuf);
        if (!e && !s->done && !s->sent_flagged && s->sent.len >= s->sent_limit) {
            s->sent_flagged = 1;
            e = EV_SENT;
        }
        if (e) {
            PyObject *t = Py_BuildValue("(ni)", h, e);
            if (t == NULL || PyList_Append(out, t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(t);
        }
    }
    return out;
}

/* take(handle) -> the payload written since the last take */
static PyObject *Pump_take(Pump *self, PyObject *arg) {
    stream_t *s = get(self, PyLong_AsSsize_t(arg));
    if (s == NULL) return NULL;
    PyObject *b = PyBytes_FromStringAndSize(s->sent.p, s->sent.len);
    s->sent.len = 0;
    buf_fit(&s->sent);
    s->sent_flagged = 0;
    return b;
}

/* last(handle) -> CLOCK_MONOTONIC seconds of the stream's last progress */
static PyObject *Pump_last(Pump *self, PyObject *arg) {
    stream_t *s = get(self, PyLong_AsSsize_t(arg));
    if (s == NULL) return NULL;
    return PyFloat_FromDouble(s->last);
}

/* blocked(handle) -> whether the stream waits for the client's socket to take what it has */
static PyObject *Pump_blocked(Pump *self, PyObject *arg) {
    stream_t *s = get(self, PyLong_AsSsize_t(arg));
    if (s == NULL) return NULL;
    return PyBool_FromLong(s->blocked);
}

/* remove(handle) -> (sent, pending, out): the payload written since the last take, a
 * record's beginning not written, and framed bytes the client's socket did not take. */
static PyObject *Pump_remove(Pump *self, PyObject *arg) {
    Py_ssize_t h = PyLong_AsSsize_t(arg);
    stream_t *s = get(self, h);
    if (s == NULL) return NULL;
    PyObject *t = Py_BuildValue("(y#y#y#)", s->sent.p ? s->sent.p : "", (Py_ssize_t)s->sent.len,
                                s->pending.p ? s->pending.p : "", (Py_ssize_t)s->pending.len,
                                s->out.p ? s->out.p : "", (Py_ssize_t)s->out.len);
    free_stream(self, h);
    return t;
}

static PyMethodDef Pump_methods[] = {
    {"fileno", (PyCFunction)Pump_fileno, METH_NOARGS, "the epoll set's fd (readable: run() has work)"},
    {"add", (PyCFunction)Pump_add, METH_VARARGS,
     "add(backend_fd, client_fd, sep, pending, sent_limit, record_limit=0, check=None) -> handle"},
    {"run", (PyCFunction)Pump_run, METH_O, "run(most): relay what is ready; [(handle, event), ...]"},
    {"take", (PyCFunction)Pump_take, METH_O, "take(handle) -> payload written since the last take"},
    {"last", (PyCFunction)Pump_last, METH_O, "last(handle) -> monotonic seconds of the last progress"},
    {"blocked", (PyCFunction)Pump_blocked, METH_O, "blocked(handle) -> waiting for the client's socket"},
    {"remove", (PyCFunction)Pump_remove, METH_O, "remove(handle) -> (sent, pending, out)"},
    {"close", (PyCFunction)Pump_close, METH_NOARGS, "close the epoll set and every stream's dups"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PumpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "nomyo_router.relay._pump.Pump",
    .tp_basicsize = sizeof(Pump),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Relays chunked streams from backend sockets to client sockets (pump.py).",
    .tp_new = Pump_new,
    .tp_dealloc = (destructor)Pump_dealloc,
    .tp_methods = Pump_methods,
};

/* marked(data) -> whether `data` (bytes) holds `"error"`: the Python relay's per-read check
 * for an error record (error_record.py), with glibc's memmem (a few times faster on JSON
 * than bytes.find, whose loop stops at every quote). */
static PyObject *marked(PyObject *module, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "marked() takes bytes");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n >= 7 && memmem(PyBytes_AS_STRING(arg), (size_t)n, "\"error\"", 7) != NULL) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* frame(data, cuts) -> (outcome, payload, dirty): `data` decoded as a chunked body by the
 * pump's own decode(), in pieces split at the ascending offsets in `cuts` (as reads would
 * bring it). outcome 0: more is needed; END or END_DIRTY: the body ended (dirty: trailers, or
 * bytes after it in the same piece); BAD: malformed. The differential fuzz of the framing
 * against a reference parser drives this (test/test_pump_fuzz.py): the very code every read
 * of a relayed stream runs, without the sockets around it. */
static PyObject *frame(PyObject *module, PyObject *args) {
    const char *d;
    Py_ssize_t n;
    PyObject *cuts;
    if (!PyArg_ParseTuple(args, "y#O", &d, &n, &cuts)) return NULL;
    PyObject *seq = PySequence_Fast(cuts, "cuts: a sequence of offsets");
    if (seq == NULL) return NULL;
    stream_t s;
    memset(&s, 0, sizeof s);
    s.state = S_SIZE;
    Py_ssize_t at = 0, k = 0, m = PySequence_Fast_GET_SIZE(seq);
    int outcome = 0;
    while (at < n && !outcome) {
        Py_ssize_t next = n;
        while (k < m) {
            Py_ssize_t c = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, k++));
            if (c == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                buf_free(&s.pending);
                return NULL;
            }
            if (c > at && c < n) {
                next = c;
                break;
            }
        }
        outcome = decode(&s, d + at, (size_t)(next - at));
        at = next;
        if (!outcome && s.state == S_DONE) outcome = s.dirty ? EV_END_DIRTY : EV_END;
    }
    Py_DECREF(seq);
    PyObject *t = Py_BuildValue("(iy#i)", outcome, s.pending.p ? s.pending.p : "", (Py_ssize_t)s.pending.len, s.dirty);
    buf_free(&s.pending);
    return t;
}

static PyMethodDef module_methods[] = {
    {"marked", marked, METH_O, "marked(data) -> whether data holds the bytes \"error\""},
    {"frame", frame, METH_VARARGS, "frame(data, cuts) -> (outcome, payload, dirty): decode() over pieces"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pump", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__pump(void) {
    if (PyType_Ready(&PumpType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PumpType);
    if (PyModule_AddObject(m, "Pump", (PyObject *)&PumpType) < 0) {
        Py_DECREF(&PumpType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "END", EV_END);
    PyModule_AddIntConstant(m, "END_DIRTY", EV_END_DIRTY);
    PyModule_AddIntConstant(m, "CUT", EV_CUT);
    PyModule_AddIntConstant(m, "BAD", EV_BAD);
    PyModule_AddIntConstant(m, "CLIENT", EV_CLIENT);
    PyModule_AddIntConstant(m, "SENT", EV_SENT);
    PyModule_AddIntConstant(m, "LONG", EV_LONG);
    PyModule_AddIntConstant(m, "ERROR", EV_ERROR);
    return m;
}
