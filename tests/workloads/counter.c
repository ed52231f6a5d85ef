/* A process tree that counts, and checks itself after every restore.
 *
 * Holds: two threads, a child fed through a pipe and answering over a unix
 * socket, a grandchild pair, a regular file, a deleted file, a /dev/shm
 * mapping, and optionally a TCP listener. Every tick (50 ms) it verifies that
 * each of these still carries what it should; on any violation it prints
 * "FAIL: <why>" and exits 1. Its count is visible from outside as its
 * command name (/proc/<pid>/comm = "cnt:<n>"), per process, so a source and
 * its restored copy can be told apart.
 *
 * usage: counter DIR [PORT [DEVICE]]   (PORT 0 or absent: no listener)
 * DEVICE: a file it maps shared, as a CUDA process maps /dev/nvidia*; the
 * GPU-less tests give a stand-in so gpusnap takes it for a GPU process.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PATTERN_SIZE 65536

static atomic_long count;
static atomic_long heartbeat;

static void fail(const char *why) {
  printf("FAIL: %s (count %ld, errno %s)\n", why, atomic_load(&count), strerror(errno));
  fflush(stdout);
  kill(0, SIGKILL); /* the whole tree: a half-working tree must not look alive */
  _exit(1);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void fill(unsigned char *buf, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(seed * 31u + i * 7u);
}

static void *beat(void *arg) {
  (void)arg;
  for (;;) {
    atomic_fetch_add(&heartbeat, 1);
    sleep_ms(20);
  }
  return NULL;
}

/* Answers each connection's lines with the current count; stays connected. */
static void *serve_conn(void *arg) {
  int c = (int)(long)arg;
  char buf[256];
  ssize_t n;
  while ((n = read(c, buf, sizeof buf)) > 0) {
    char out[64];
    int len = snprintf(out, sizeof out, "%ld\n", atomic_load(&count));
    if (write(c, out, (size_t)len) != len) break;
  }
  close(c);
  return NULL;
}

static void *listener(void *arg) {
  int port = (int)(long)arg;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 8) != 0) fail("listen");
  for (;;) {
    int c = accept(s, NULL, NULL);
    if (c < 0) continue;
    pthread_t t;
    pthread_create(&t, NULL, serve_conn, (void *)(long)c);
    pthread_detach(t);
  }
  return NULL;
}

/* The child: reads consecutive numbers from the pipe, answers n*2 on the socket. */
static void echo_child(int rd, int sk) {
  prctl(PR_SET_NAME, "cnt-child");
  long expect = -1, v;
  for (;;) {
    if (read(rd, &v, sizeof v) != sizeof v) fail("child: pipe read");
    if (expect >= 0 && v != expect) fail("child: pipe sequence broken");
    expect = v + 1;
    long answer = v * 2;
    if (write(sk, &answer, sizeof answer) != sizeof answer) fail("child: socket write");
  }
}

static void idle_pair(void) {
  prctl(PR_SET_NAME, "cnt-idle");
  if (fork() == 0) prctl(PR_SET_NAME, "cnt-idle2");
  for (;;) sleep_ms(1000);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: counter DIR [PORT]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *dir = argv[1];
  int port = argc > 2 ? atoi(argv[2]) : 0;
  char path[4096];

  static unsigned char pattern[PATTERN_SIZE], check[PATTERN_SIZE];
  fill(pattern, sizeof pattern, 7);

  snprintf(path, sizeof path, "%s/regular.txt", dir);
  int regular = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (regular < 0 || write(regular, "regular-file-content", 20) != 20) fail("regular file");

  snprintf(path, sizeof path, "%s/deleted.bin", dir);
  int deleted = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (deleted < 0 || write(deleted, pattern, sizeof pattern) != (ssize_t)sizeof pattern) fail("deleted file");
  unlink(path);

  /* Named after DIR, so a test knows what to clean up. */
  snprintf(path, sizeof path, "/dev/shm/gpusnap-counter%s", dir);
  for (char *c = path + strlen("/dev/shm/"); *c; c++)
    if (*c == '/') *c = '_';
  int shm = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (shm < 0 || ftruncate(shm, sizeof pattern + sizeof(long)) != 0) fail("shm file");
  unsigned char *shared = mmap(NULL, sizeof pattern + sizeof(long), PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
  if (shared == MAP_FAILED) fail("shm mmap");
  memcpy(shared, pattern, sizeof pattern);
  long *shm_count = (long *)(shared + sizeof pattern);

  int p[2], sv[2];
  if (pipe(p) != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) fail("pipe/socketpair");
  if (fork() == 0) {
    close(p[1]);
    close(sv[0]);
    echo_child(p[0], sv[1]);
  }
  close(p[0]);
  close(sv[1]);
  if (fork() == 0) idle_pair();

  if (argc > 3) {
    int dev = open(argv[3], O_RDWR);
    if (dev < 0 || mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, dev, 0) == MAP_FAILED) fail("device file");
  }

  pthread_t t;
  pthread_create(&t, NULL, beat, NULL);
  if (port > 0) pthread_create(&t, NULL, listener, (void *)(long)port);

  long last_beat = -1;
  int beat_stalls = 0;
  for (;;) {
    long n = atomic_fetch_add(&count, 1) + 1;
    if (write(p[1], &n, sizeof n) != sizeof n) fail("pipe write");
    long answer;
    if (read(sv[0], &answer, sizeof answer) != sizeof answer) fail("socket read");
    if (answer != n * 2) fail("socket answer wrong");

    char buf[32] = {0};
    if (pread(regular, buf, 20, 0) != 20 || memcmp(buf, "regular-file-content", 20) != 0) fail("regular file content");
    if (pread(deleted, check, sizeof check, 0) != (ssize_t)sizeof check || memcmp(check, pattern, sizeof check) != 0)
      fail("deleted file content");
    if (memcmp(shared, pattern, sizeof pattern) != 0) fail("shm content");
    *shm_count = n; /* written, not checked: a --leave-running source shares the file */

    long b = atomic_load(&heartbeat);
    beat_stalls = (b == last_beat) ? beat_stalls + 1 : 0;
    if (beat_stalls > 40) fail("heartbeat thread stopped");
    last_beat = b;

    char name[16];
    snprintf(name, sizeof name, "cnt:%ld", n);
    prctl(PR_SET_NAME, name);
    if (n % 20 == 0) printf("count %ld\n", n);
    sleep_ms(50);
  }
}
