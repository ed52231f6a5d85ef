/* A tree holding a known pattern in a large private anonymous memory, that
 * counts and checks its memory after every restore (a lazy one included).
 *
 * The parent fills MB MiB, its child MB/4 MiB, every 8-byte word of page p
 * but the first with a pattern of (p, word); the first word of each page is
 * a stamp: the last count c with c % pages == p, 0 before. Each tick (50 ms)
 * the count goes up and stamps its page, after checking that page whole
 * (stamp and pattern); the count is visible as /proc/<pid>/comm
 * ("mem:<n>", the child "memc:<n>"). On SIGUSR1 (the parent passes it on to
 * the child) each checks every page and writes DIR/report-<role>.txt,
 * atomically: "count C hash H" with H a hash of the pattern words alone, so
 * one snapshot restored any way reports the same H. Any mismatch prints
 * "FAIL: <why>" and kills the tree.
 *
 * usage: memfill DIR MB
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define WORDS (PAGE / 8)

static volatile sig_atomic_t asked;
static const char *dir;
static const char *role;
static uint64_t count;

static void fail(const char *why, uint64_t page) {
  printf("FAIL: %s: %s at page %" PRIu64 " (count %" PRIu64 ")\n", role, why, page, count);
  fflush(stdout);
  kill(0, SIGKILL);
  _exit(1);
}

static uint64_t pattern(uint64_t page, uint64_t word) {
  uint64_t z = (page << 9 | word) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The stamp page p must hold at `count`: the last c <= count with c % pages == p. */
static uint64_t expected_stamp(uint64_t p, uint64_t pages) {
  if (count < p || (p == 0 && count < pages)) return 0;
  return count - (count - p) % pages;
}

static void check_page(uint64_t *mem, uint64_t p, uint64_t pages) {
  uint64_t *w = mem + p * WORDS;
  if (w[0] != expected_stamp(p, pages)) fail("stamp", p);
  for (uint64_t k = 1; k < WORDS; k++)
    if (w[k] != pattern(p, k)) fail("pattern", p);
}

static void report(uint64_t *mem, uint64_t pages) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t p = 0; p < pages; p++) {
    check_page(mem, p, pages);
    for (uint64_t k = 1; k < WORDS; k++) h = (h ^ mem[p * WORDS + k]) * 1099511628211ull;
  }
  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%s/.report-%s.tmp", dir, role);
  snprintf(path, sizeof path, "%s/report-%s.txt", dir, role);
  FILE *f = fopen(tmp, "w");
  if (!f) fail("writing the report", 0);
  fprintf(f, "count %" PRIu64 " hash %016" PRIx64 "\n", count, h);
  fclose(f);
  if (rename(tmp, path) != 0) fail("publishing the report", 0);
}

static void on_usr1(int sig) {
  (void)sig;
  asked = 1;
}

static void run(uint64_t mib, pid_t pass_on) {
  uint64_t pages = mib * 1024 * 1024 / PAGE;
  uint64_t *mem = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) fail("mmap", 0);
  for (uint64_t p = 0; p < pages; p++) {
    mem[p * WORDS] = 0;
    for (uint64_t k = 1; k < WORDS; k++) mem[p * WORDS + k] = pattern(p, k);
  }
  printf("%s: %" PRIu64 " MiB filled\n", role, mib);
  fflush(stdout);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, NULL);
  for (;;) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    if (asked) {
      asked = 0;
      if (pass_on > 0) kill(pass_on, SIGUSR1);
      report(mem, pages);
    }
    uint64_t next = count + 1, p = next % pages;
    check_page(mem, p, pages);
    mem[p * WORDS] = next;
    count = next;
    char name[16];
    snprintf(name, sizeof name, "%s:%" PRIu64, pass_on > 0 ? "mem" : "memc", count);
    prctl(PR_SET_NAME, name);
  }
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: memfill DIR MB\n");
    return 2;
  }
  dir = argv[1];
  uint64_t mib = strtoull(argv[2], NULL, 10);
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGUSR1, SIG_IGN); /* until each has its memory and its handler */
  pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    role = "child";
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    run(mib / 4 > 0 ? mib / 4 : 1, 0);
  }
  role = "parent";
  run(mib, child);
  return 0;
}
