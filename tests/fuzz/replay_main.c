/* A plain main() for the fuzz harnesses, built with the normal compiler: runs every file
 * named on the command line (or every file in a named directory) through the harness once.
 * This is how `make test` replays the seed corpus and every crash ever found
 * (tests/fuzz/corpus/<harness>/, tests/fuzz/regressions/<harness>/). A harness reports a
 * broken invariant by aborting, so a failure here is a crash with the file's name before it. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                fclose(f);
                free(buf);
                fprintf(stderr, "replay: out of memory reading %s\n", path);
                return 1;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        if (!got) break;
        n += got;
    }
    fclose(f);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Files of a directory, in name order (so a replay is the same every time). */
static int replay_dir(const char *dir, int *count) {
    DIR *d = opendir(dir);
    if (!d) return 0; /* an absent regressions folder is an empty one */
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char **nn = realloc(names, (n + 1) * sizeof *names);
        if (!nn) break;
        names = nn;
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len))) break;
        snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_names);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        rc |= replay_file(names[i]);
        free(names[i]);
        ++*count;
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    int rc = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) rc |= replay_dir(argv[i], &count);
        else if (stat(argv[i], &st) == 0) rc |= replay_file(argv[i]), count++;
        else if (strstr(argv[i], "regressions") == NULL) { /* the corpus must be there */
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            rc = 1;
        }
    }
    printf("replayed %d inputs: %s\n", count, rc ? "FAILED" : "ok");
    return rc;
}
