/*
 * LD_PRELOAD shim: set TCP_NODELAY on every TCP connection a process accepts.
 *
 * Why: sglang-router 0.3.2 does not set TCP_NODELAY on the connections it accepts. With Nagle's algorithm
 * on, a small SSE chunk written while an earlier one is still unacknowledged waits for the client's
 * delayed ACK (about 40 ms on Linux), so a keep-alive client sending requests back to back sees its first
 * streamed token ~35 ms late. That is a transport property of the release, not routing; benchmarks/peers.sh
 * reports the peers both ways: "stock" (as shipped) and "+nodelay" (this shim preloaded).
 *
 * Built at benchmark time, never committed as a binary:
 *   gcc -O2 -shared -fPIC -o /tmp/nodelay_shim.so benchmarks/nodelay_shim.c -ldl
 *   LD_PRELOAD=/tmp/nodelay_shim.so some-server ...
 * Set NODELAY_SHIM_LOG=1 to print one line to stderr per accepted socket (with the value it had before:
 * 0 means the server had not set TCP_NODELAY itself).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef int (*setsockopt_fn)(int, int, int, const void *, socklen_t);

static int logging(void) {
    return getenv("NODELAY_SHIM_LOG") != NULL;
}

static setsockopt_fn real_setsockopt(void) {
    static setsockopt_fn real = NULL;
    if (real == NULL) {
        real = (setsockopt_fn)dlsym(RTLD_NEXT, "setsockopt");
    }
    return real;
}

static void set_nodelay(int fd) {
    if (fd < 0) {
        return;
    }
    int type = 0;
    socklen_t type_len = sizeof(type);
    struct sockaddr_storage addr;
    socklen_t addr_len = sizeof(addr);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM) {
        return;
    }
    if (getsockname(fd, (struct sockaddr *)&addr, &addr_len) != 0) {
        return;
    }
    if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) {
        return;
    }
    int before = 0;
    socklen_t before_len = sizeof(before);
    getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &before, &before_len);
    int one = 1;
    int rc = real_setsockopt()(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (logging()) {
        fprintf(stderr, "nodelay_shim: fd %d TCP_NODELAY was %d, %s\n", fd, before, rc == 0 ? "set" : "failed");
    }
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    static accept_fn real = NULL;
    if (real == NULL) {
        real = (accept_fn)dlsym(RTLD_NEXT, "accept");
    }
    int conn = real(fd, addr, len);
    set_nodelay(conn);
    return conn;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    static accept4_fn real = NULL;
    if (real == NULL) {
        real = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
    }
    int conn = real(fd, addr, len, flags);
    set_nodelay(conn);
    return conn;
}

/* Pass-through; with NODELAY_SHIM_LOG set, says when the program sets TCP_NODELAY itself. */
int setsockopt(int fd, int level, int name, const void *value, socklen_t len) {
    if (level == IPPROTO_TCP && name == TCP_NODELAY && logging() && value != NULL && len >= sizeof(int)) {
        fprintf(stderr, "nodelay_shim: program sets TCP_NODELAY=%d on fd %d\n", *(const int *)value, fd);
    }
    return real_setsockopt()(fd, level, name, value, len);
}
