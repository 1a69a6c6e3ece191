/* Routes malloc and friends to glibc's allocator, for redis-server under libfaketime.
 *
 * Debian's redis-server uses jemalloc, whose initialisation calls clock_gettime() while
 * libfaketime is still resolving symbols, and the process dies (libfaketime issue 130).
 * Preloaded before libfaketime, this shim keeps jemalloc out of the allocation path. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t size) { return __libc_calloc(n, size); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void *memalign(size_t align, size_t n) { return __libc_memalign(align, n); }
void *aligned_alloc(size_t align, size_t n) { return __libc_memalign(align, n); }

int posix_memalign(void **out, size_t align, size_t n) {
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

/* jemalloc's malloc_usable_size would be asked about glibc's blocks: ask glibc. */
size_t malloc_usable_size(void *p) {
    static size_t (*glibc)(void *);
    if (!glibc) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        glibc = (size_t (*)(void *))dlsym(libc, "malloc_usable_size");
    }
    return glibc(p);
}
