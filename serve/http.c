/* polar serve's HTTP side, through libmicrohttpd: a thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION), so a request's thread may block while
 * the engine works for it. It routes, checks the API key (in constant
 * time), bounds bodies (413) and idle connections (a slow client is cut
 * after --timeout), hands parsed requests to the engine, and answers:
 * at once with the whole response, or as server-sent events while tokens
 * come (a content reader that waits on the engine). A client that goes
 * away (its socket hung up, or a write fails) cancels its request, whose
 * sequences leave the batch and give their KV blocks back. SIGTERM or
 * SIGINT: new requests get 503, those in flight finish, then it stops. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "serve.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_compat; /* libmicrohttpd before 0.9.71 answered int */
#define MHD_Result MHD_Result_compat
#else
#define MHD_Result enum MHD_Result
#endif

typedef enum { R_COMPLETIONS, R_CHAT, R_MODELS, R_HEALTH, R_METRICS } route;

/* One request on a connection (MHD's per-request pointer). */
typedef struct {
    serve_server *s;
    route r;
    int fd;                 /* the client's socket: polled to see it hang up */
    sbuf body;              /* the request body, at most max_body bytes */
    int too_large;
    serve_request *req;     /* once accepted: the engine's */
    sbuf out;               /* streaming: events not yet handed to MHD, from out_pos */
    size_t out_pos;
    int finished;           /* streaming: the last event is in out */
} conn;

/* ------------------------------------------------------------- answers */

static MHD_Result respond(conn *k, struct MHD_Connection *c, int status, const char *type, char *body) {
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":null}}\n";
    if (!body) status = 500;
    struct MHD_Response *r = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE)
                                  : MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, body ? type : "application/json");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 429 || status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, k->r <= R_CHAT ? "POST" : "GET");
    atomic_fetch_add(&k->s->by_status[serve_status_index(status)], 1);
    MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static MHD_Result respond_error(conn *k, struct MHD_Connection *c, int status, const char *param, const char *msg) {
    serve_fail f = {.status = status};
    snprintf(f.param, sizeof f.param, "%s", param);
    snprintf(f.msg, sizeof f.msg, "%s", msg);
    return respond(k, c, status, "application/json", reply_error(&f));
}

static int client_gone(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* The Bearer token against the key, in time that depends on the key's
 * length only. */
static int key_matches(const char *auth, const char *key) {
    const char *given = auth && !strncmp(auth, "Bearer ", 7) ? auth + 7 : "";
    size_t n = strlen(key), m = strlen(given);
    unsigned char diff = m != n;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? given[i] : 0);
    return diff == 0;
}

/* --------------------------------------------------------- streaming */

/* MHD asks for the next bytes of an event stream: wait for the engine's
 * news, turn it into events, hand them over. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    conn *k = cls;
    serve_engine *e = k->s->engine;
    (void)pos;
    while (k->out_pos == k->out.len) {
        if (k->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        k->out.len = k->out_pos = 0;
        engine_lock(e);
        for (;;) {
            if (!reply_stream(k->s, k->req, &k->out, &k->finished)) {
                engine_cancel(e, k->req);
                engine_unlock(e);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (k->out.len || k->finished) break;
            engine_wait(e, k->req, 100);
            if (client_gone(k->fd)) {
                engine_cancel(e, k->req);
                engine_unlock(e);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        engine_unlock(e);
    }
    size_t n = k->out.len - k->out_pos < max ? k->out.len - k->out_pos : max;
    memcpy(buf, k->out.s + k->out_pos, n);
    k->out_pos += n;
    return (ssize_t)n;
}

static MHD_Result start_stream(conn *k, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, k, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    atomic_fetch_add(&k->s->by_status[serve_status_index(200)], 1);
    MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---------------------------------------------------------- requests */

/* A body is whole: parse it, queue it, answer. */
static MHD_Result generate(conn *k, struct MHD_Connection *c) {
    serve_server *s = k->s;
    serve_fail f = {0};
    k->req = api_parse(s, k->r == R_CHAT ? SERVE_CHAT : SERVE_COMPLETION, k->body.s ? k->body.s : "", k->body.len, &f);
    if (!k->req) return respond(k, c, f.status, "application/json", reply_error(&f));
    int refused = engine_submit(s->engine, k->req, k->req->arrived_ms + 1000.0 * s->o.deadline_s);
    if (refused) {
        api_request_free(k->req);
        k->req = NULL;
        return respond_error(k, c, refused, "",
                             refused == 429 ? "too many requests are waiting for room in the batch; retry later"
                                            : "the server is shutting down or its batch failed");
    }
    /* from here the request's deadline, not the idle timeout, bounds the wait */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0);
    if (k->req->stream) return start_stream(k, c);
    serve_engine *e = s->engine;
    engine_lock(e);
    while (!k->req->done) {
        engine_wait(e, k->req, 100);
        if (!k->req->done && client_gone(k->fd)) {
            engine_cancel(e, k->req);
            engine_unlock(e);
            return MHD_NO; /* nobody to answer: MHD closes the connection */
        }
    }
    engine_unlock(e);
    if (k->req->status) return respond_error(k, c, k->req->status, "", k->req->error);
    return respond(k, c, 200, "application/json", reply_complete(s, k->req));
}

static MHD_Result answer_get(conn *k, struct MHD_Connection *c) {
    serve_server *s = k->s;
    if (k->r == R_MODELS) return respond(k, c, 200, "application/json", reply_models(s));
    if (k->r == R_METRICS) return respond(k, c, 200, "text/plain; version=0.0.4", reply_metrics(s));
    serve_engine_stats st;
    engine_stats(s->engine, &st);
    int draining = atomic_load(&s->draining);
    const char *state = st.failed ? "error" : draining ? "shutting down" : "ok";
    char *body = malloc(64);
    if (body) snprintf(body, 64, "{\"status\":\"%s\"}\n", state);
    return respond(k, c, st.failed || draining ? 503 : 200, "application/json", body);
}

/* Which route a path is; -1: none. */
static int find_route(const serve_server *s, const char *url) {
    static const char *const paths[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(url, paths[i])) return i;
    /* /v1/models/NAME: the one model */
    if (!strncmp(url, "/v1/models/", 11) && !strcmp(url + 11, s->o.model_name)) return R_MODELS;
    return -1;
}

/* The first call for a request: its headers are in. Answer what needs no
 * body (GETs, refusals), or say yes to the body. */
static MHD_Result begin(conn *k, struct MHD_Connection *c, const char *url, const char *method) {
    serve_server *s = k->s;
    int r = find_route(s, url);
    if (r < 0) return respond_error(k, c, 404, "", "no such endpoint (see GET /v1/models, POST /v1/completions, "
                                                   "POST /v1/chat/completions, GET /health, GET /metrics)");
    k->r = (route)r;
    int post = !strcmp(method, "POST");
    if (post != (k->r <= R_CHAT) || (!post && strcmp(method, "GET") && strcmp(method, "HEAD")))
        return respond_error(k, c, 405, "", k->r <= R_CHAT ? "use POST" : "use GET");
    if (s->o.api_key && k->r != R_HEALTH &&
        !key_matches(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION), s->o.api_key))
        return respond_error(k, c, 401, "", "a wrong or missing API key (Authorization: Bearer KEY)");
    if (!post) return answer_get(k, c);
    if (atomic_load(&s->draining)) return respond_error(k, c, 503, "", "the server is shutting down");
    const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length && strtoull(length, NULL, 10) > s->o.max_body) k->too_large = 1;
    return MHD_YES;
}

/* Bytes onto the body (NULs and all), NUL-terminated for the parser's
 * messages; 0 when out of memory. */
static int body_append(sbuf *b, const char *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *t = realloc(b->s, cap);
        if (!t) return 0;
        b->s = t, b->cap = cap;
    }
    memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = 0;
    return 1;
}

static MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                             const char *version, const char *upload, size_t *upload_size, void **state) {
    conn *k = *state;
    (void)version;
    if (!k) {
        serve_server *s = cls;
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *state = k;
        k->s = s;
        atomic_fetch_add(&s->in_flight, 1);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        MHD_Result ret = begin(k, c, url, method);
        if (k->too_large) { /* said before reading a byte of it */
            char msg[96];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->o.max_body);
            return respond_error(k, c, 413, "", msg);
        }
        return ret;
    }
    if (*upload_size) {
        if (!k->too_large && k->body.len + *upload_size > k->s->o.max_body) k->too_large = 1;
        if (!k->too_large && !body_append(&k->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->too_large) { /* a body of no announced length that grew too large */
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", k->s->o.max_body);
        return respond_error(k, c, 413, "", msg);
    }
    return generate(k, c);
}

/* MHD is done with a request (answered, failed, or its client gone). */
static void on_completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode why) {
    serve_server *s = cls;
    conn *k = *state;
    (void)c, (void)why;
    if (!k) return;
    if (k->req) {
        engine_lock(s->engine);
        engine_cancel(s->engine, k->req); /* nothing to do unless it still runs: its client is gone */
        engine_unlock(s->engine);
        api_request_free(k->req);
    }
    free(k->body.s);
    free(k->out.s);
    free(k);
    *state = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}

/* ------------------------------------------------------------- serve_run */

/* The listening socket on host:port; -1 after printing why not. */
static int listen_on(const char *host, int port, int *family) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &ai);
    if (rc) {
        fprintf(stderr, "polar serve: error: --host %s: %s\n", host, gai_strerror(rc));
        return -1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol), one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(fd, ai->ai_addr, ai->ai_addrlen) ||
        listen(fd, 128)) {
        fprintf(stderr, "polar serve: error: cannot listen on %s port %d: %s\n", host, port, strerror(errno));
        if (fd >= 0) close(fd);
        fd = -1;
    }
    *family = ai->ai_family;
    freeaddrinfo(ai);
    return fd;
}

static int bound_port(int fd) {
    struct sockaddr_storage a;
    socklen_t n = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &n)) return -1;
    return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
}

/* After SIGTERM: the listening socket closed (a new connection is
 * refused at once rather than left waiting), new requests on open
 * connections get 503; wait (at most a deadline and a timeout) for the
 * requests in flight to finish. */
static void drain(serve_server *s, struct MHD_Daemon *d) {
    atomic_store(&s->draining, 1);
    MHD_socket fd = MHD_quiesce_daemon(d);
    if (fd != MHD_INVALID_SOCKET) close(fd); /* quiesced: the socket is ours again */
    int n = atomic_load(&s->in_flight);
    printf("polar serve: shutting down: %d request%s in flight\n", n, n == 1 ? "" : "s");
    fflush(stdout);
    double until = polar_time_ms() + 1000.0 * (s->o.deadline_s + s->o.timeout_s);
    while (atomic_load(&s->in_flight) > 0 && polar_time_ms() < until) usleep(20 * 1000);
}

/* SIGTERM and SIGINT, which serve_run waits for. */
static void stop_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
}

void serve_block_signals(void) {
    sigset_t stop;
    stop_signals(&stop);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
}

int serve_run(serve_server *s) {
    int family, fd = listen_on(s->o.host, s->o.port, &family);
    if (fd < 0) return 1;
    sigset_t stop;
    stop_signals(&stop);
    serve_block_signals(); /* done already by a caller that made threads before */
    signal(SIGPIPE, SIG_IGN);
    polar_error err;
    if (engine_start(s->model, s->tok, &s->batch, s->o.queue, &s->engine, &err) != POLAR_OK) {
        fprintf(stderr, "polar serve: error: %s\n", err.msg);
        close(fd);
        return 1;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     (family == AF_INET6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->o.timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)32768, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "polar serve: error: libmicrohttpd would not start on %s port %d\n", s->o.host, s->o.port);
        engine_stop(s->engine);
        close(fd);
        return 1;
    }
    serve_engine_stats st;
    engine_stats(s->engine, &st);
    printf("polar serve: listening on http://%s%s%s:%d (model %s on %s, KV %s, max batch %d, context %d)\n",
           family == AF_INET6 ? "[" : "", s->o.host, family == AF_INET6 ? "]" : "", bound_port(fd), s->o.model_name,
           st.device, st.kv_type, s->batch.max_seqs, s->batch.max_ctx);
    fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    drain(s, d);
    MHD_stop_daemon(d);
    engine_stop(s->engine);
    s->engine = NULL;
    printf("polar serve: stopped (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    return 0;
}
