/* The redis-server fixture (redis_fixture.h). */
#define _GNU_SOURCE
#include "redis_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

int rf_installed(void) { return system("command -v redis-server >/dev/null 2>&1") == 0; }

int rf_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || getsockname(fd, (struct sockaddr *)&sa, &len)) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

redisContext *rf_connect(const rf_redis *r)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

int rf_start(rf_redis *r, const char *dir, const char *pass)
{
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    r->pid = fork();
    if (r->pid < 0) {
        r->pid = 0;
        return -1;
    }
    if (r->pid == 0) {
        if (!freopen("/dev/null", "w", stdout)) _exit(127);
        if (pass && *pass)
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
                   "no", "--dir", dir, "--loglevel", "warning", "--requirepass", pass, (char *)NULL);
        else
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
                   "no", "--dir", dir, "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) {
        redisContext *c = rf_connect(r);
        if (c) {
            /* With a password PING answers NOAUTH: an error reply still means it is up. */
            redisReply *rep = redisCommand(c, "PING");
            int ok = rep && (rep->type == REDIS_REPLY_STATUS || rep->type == REDIS_REPLY_ERROR);
            freeReplyObject(rep);
            redisFree(c);
            if (ok) return 0;
        }
        if (waitpid(r->pid, NULL, WNOHANG) == r->pid) {   /* it exited (port taken?) */
            r->pid = 0;
            return -1;
        }
        usleep(50000);
    }
    rf_kill9(r);
    return -1;
}

void rf_kill9(rf_redis *r)
{
    if (r->pid <= 0) return;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
}

void rf_shutdown(rf_redis *r)
{
    if (r->pid <= 0) return;
    redisContext *c = rf_connect(r);
    if (c) {
        redisReply *rep = redisCommand(c, "SHUTDOWN NOSAVE");
        freeReplyObject(rep);
        redisFree(c);
    }
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
}
