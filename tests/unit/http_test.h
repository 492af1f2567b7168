// Raw-socket HTTP helpers shared by the server tests: connect to a loopback port, and read a
// response until a marker has arrived (a deadline instead of a fixed sleep) or the peer closes.
#ifndef TD_TEST_HTTP_TEST_H
#define TD_TEST_HTTP_TEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

// A connected socket to 127.0.0.1:port whose reads time out after 10 s, or -1.
static inline int td_http_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

// Appends to buf (holding *n bytes, NUL-terminated, capacity cap) until it contains needle (NULL:
// until the peer closes, a read times out or buf is full). Returns whether needle arrived.
static inline int td_http_read_until(int fd, char *buf, size_t cap, size_t *n, const char *needle) {
    for (;;) {
        buf[*n] = 0;
        if (needle && strstr(buf, needle)) return 1;
        if (*n + 1 >= cap) return 0;
        ssize_t k = read(fd, buf + *n, cap - 1 - *n);
        if (k <= 0) return 0;
        *n += (size_t)k;
    }
}

#endif
