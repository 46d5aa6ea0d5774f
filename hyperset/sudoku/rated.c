/* Exact Sudoku search for the rated puzzle generator (hyperset.sudoku.rated).
 *
 * Candidates of a cell are a 9-bit mask (bit d-1 set while digit d is possible). Propagation places naked and
 * hidden singles to a fixed point; the search branches on the first cell with the fewest candidates, digits in
 * increasing order (shuffled by the generator's random numbers when it fills a grid). The Python module
 * hyperset.sudoku.rated.py holds the same algorithm, step for step, for machines without a C compiler; the
 * tests check that both give the same puzzles.
 *
 * Boards are 81 bytes, 0 for a blank. Every function returns a negative number when a search would need more
 * than its node budget.
 */
#include <stdint.h>
#include <string.h>

#define ALL 0x1FF

static int PEERS[81][20];
static int UNITS[27][9];
static int ready;

static void init(void) {
    if (ready) return;
    for (int u = 0; u < 9; u++)
        for (int k = 0; k < 9; k++) {
            UNITS[u][k] = 9 * u + k;                                      /* rows */
            UNITS[9 + u][k] = 9 * k + u;                                  /* columns */
            UNITS[18 + u][k] = 27 * (u / 3) + 3 * (u % 3) + 9 * (k / 3) + k % 3;  /* boxes */
        }
    for (int i = 0; i < 81; i++) {
        int n = 0;
        for (int j = 0; j < 81; j++) {
            if (j == i) continue;
            if (j / 9 == i / 9 || j % 9 == i % 9 || (j / 27 == i / 27 && (j % 9) / 3 == (i % 9) / 3))
                PEERS[i][n++] = j;
        }
    }
    ready = 1;
}

/* The random numbers: splitmix64, and an integer in [0, n) as (x >> 11) % n. */
static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int below(uint64_t *s, int n) { return (int)((next(s) >> 11) % (uint64_t)n); }

static void shuffle(uint64_t *s, int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = below(s, i + 1), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* Naked and hidden singles to a fixed point; 0 on a contradiction. `queue` holds the cells just made single. */
static int propagate(uint16_t *c, int *queue, int qn, int hidden) {
    for (;;) {
        while (qn) {
            int i = queue[--qn];
            uint16_t b = c[i];
            for (int k = 0; k < 20; k++) {
                int p = PEERS[i][k];
                uint16_t m = c[p];
                if (m & b) {
                    m ^= b;
                    if (!m) return 0;
                    c[p] = m;
                    if (!(m & (m - 1))) queue[qn++] = p;
                }
            }
        }
        if (!hidden) return 1;
        for (int u = 0; u < 27; u++) {
            uint16_t once = 0, twice = 0;
            for (int k = 0; k < 9; k++) {
                uint16_t m = c[UNITS[u][k]];
                twice |= once & m;
                once |= m;
            }
            if (once != ALL) return 0;
            uint16_t only = once & ~twice;
            if (!only) continue;
            for (int k = 0; k < 9; k++) {
                int i = UNITS[u][k];
                uint16_t h = c[i] & only;
                if (h && c[i] != h) {
                    if (h & (h - 1)) return 0; /* two digits that can only go in this one cell */
                    c[i] = h;
                    queue[qn++] = i;
                }
            }
        }
        if (!qn) return 1;
    }
}

typedef struct {
    int64_t nodes;     /* budget left */
    int64_t dead;      /* dead ends met */
    int limit;         /* stop after this many solutions (0: search the whole tree) */
    int found;
    uint16_t first[81];
    uint64_t *rng;     /* shuffle the digits at each branch (filling a grid), else increasing order */
    int hidden;        /* hidden singles too, else naked singles alone */
} Search;

/* Depth-first search below `c` after placing the cells in `queue`; 0 when the budget ran out. */
static int search(Search *s, uint16_t *c, int *queue, int qn) {
    if (--s->nodes < 0) return 0;
    if (!propagate(c, queue, qn, s->hidden)) {
        s->dead++;
        return 1;
    }
    int best = -1, best_n = 10;
    for (int i = 0; i < 81; i++) {
        int n = __builtin_popcount(c[i]);
        if (n > 1 && n < best_n) {
            best = i;
            best_n = n;
            if (n == 2) break;
        }
    }
    if (best < 0) {
        if (s->found++ == 0) memcpy(s->first, c, sizeof s->first);
        return 1;
    }
    int bits[9], nb = 0;
    for (uint16_t m = c[best]; m; m &= m - 1) bits[nb++] = m & -m;
    if (s->rng) shuffle(s->rng, bits, nb);
    for (int k = 0; k < nb; k++) {
        uint16_t child[81];
        int q[162];
        memcpy(child, c, sizeof child);
        child[best] = (uint16_t)bits[k];
        q[0] = best;
        if (!search(s, child, q, 1)) return 0;
        if (s->limit && s->found >= s->limit) return 1;
    }
    return 1;
}

/* Candidates of a board; 0 when two givens clash. */
static int start(const int8_t *board, uint16_t *c, int *queue, int *qn) {
    *qn = 0;
    for (int i = 0; i < 81; i++) {
        c[i] = board[i] ? (uint16_t)(1 << (board[i] - 1)) : ALL;
        if (board[i]) queue[(*qn)++] = i;
    }
    for (int i = 0; i < 81; i++)
        if (board[i])
            for (int k = 0; k < 20; k++)
                if (board[PEERS[i][k]] == board[i]) return 0;
    return 1;
}

static void digits_of(const uint16_t *c, int8_t *out) {
    for (int i = 0; i < 81; i++) out[i] = (int8_t)(__builtin_ctz(c[i]) + 1);
}

/* Solutions of `board` up to `limit` (0: all), the first in `solution`, dead ends in `dead`; -1 past the budget.
 * `hidden`: propagation places hidden singles too, else naked singles alone. */
int hs_count(const int8_t *board, int limit, int hidden, int64_t max_nodes, int8_t *solution, int64_t *dead) {
    init();
    uint16_t c[81];
    int queue[162], qn;
    Search s = {.nodes = max_nodes, .limit = limit, .hidden = hidden};
    if (dead) *dead = 0;
    if (!start(board, c, queue, &qn)) return 0;
    if (!search(&s, c, queue, qn)) return -1;
    if (dead) *dead = s.dead;
    if (s.found && solution) digits_of(s.first, solution);
    return s.found;
}

/* The puzzle's rating: the dead ends of a plain backtracking search's whole tree (naked singles between nodes;
 * the count does not depend on the digits' names); -1 when the puzzle has no unique solution, -2 past the budget. */
int64_t hs_rate(const int8_t *board, int hidden, int64_t max_nodes) {
    int64_t dead;
    int n = hs_count(board, 0, hidden, max_nodes, 0, &dead);
    if (n < 0) return -2;
    return n == 1 ? dead : -1;
}

/* A random full grid: the search from an empty board, digits shuffled at every branch. */
static void random_grid(uint64_t *rng, int8_t *grid) {
    uint16_t c[81];
    int queue[162];
    for (int i = 0; i < 81; i++) c[i] = ALL;
    Search s = {.nodes = INT64_MAX, .limit = 1, .rng = rng, .hidden = 1};
    search(&s, c, queue, 0);
    digits_of(s.first, grid);
}

/* Whether the puzzle's only solution has `digit` at `cell` (blank in the puzzle): no solution puts another. */
static int forced(const int8_t *puzzle, int cell, int digit) {
    uint16_t c[81];
    int queue[162], qn;
    start(puzzle, c, queue, &qn);
    c[cell] = (uint16_t)(ALL ^ (1 << (digit - 1)));
    if (!(c[cell] & (c[cell] - 1))) queue[qn++] = cell;
    Search s = {.nodes = INT64_MAX, .limit = 1, .hidden = 1};
    search(&s, c, queue, qn);
    return s.found == 0;
}

/* Blank the givens in a random order wherever the solution stays unique: a minimal puzzle. */
static void minimize(uint64_t *rng, int8_t *puzzle, const int8_t *grid) {
    int order[81], n = 0;
    for (int i = 0; i < 81; i++)
        if (puzzle[i]) order[n++] = i;
    shuffle(rng, order, n);
    for (int k = 0; k < n; k++) {
        int i = order[k];
        puzzle[i] = 0;
        if (!forced(puzzle, i, grid[i])) puzzle[i] = grid[i];
    }
}

static int64_t distance(int64_t r, int64_t lo, int64_t hi) {
    return r < lo ? lo - r : r > hi ? r - hi : 0;
}

static int written(const int8_t *puzzles, int64_t n, const int8_t *p) {
    for (int64_t k = 0; k < n; k++)
        if (!memcmp(puzzles + 81 * k, p, 81)) return 1;
    return 0;
}

/* `count` minimal puzzles whose rating lies in [lo, hi] (hi < 0: no upper bound), from the random numbers `seed`.
 * A random grid gives a random minimal puzzle. A move swaps a given for another cell of the solution and makes
 * the puzzle minimal again; it is kept when the puzzle's rating comes no further from the range. In the range,
 * a puzzle is written out, and the next one after `spacing` more kept moves (all in the range), unless the
 * climb to the first took no more moves than that: then a new grid. After `patience` moves that neither wrote a
 * puzzle nor came closer to the range, a new grid too. `hidden` rates with hidden singles
 * too. Writes 81 digits per puzzle, its solution and rating; returns the moves made, or -1 after `max_moves`. */
int64_t hs_generate(uint64_t seed, int64_t lo, int64_t hi, int hidden, int64_t patience, int64_t max_moves,
                    int64_t rate_nodes, int64_t count, int64_t spacing, int8_t *puzzles, int8_t *solutions,
                    int64_t *ratings) {
    init();
    uint64_t rng = seed;
    if (hi < 0) hi = INT64_MAX;
    int64_t moves = 0, emitted = 0;
    while (emitted < count) {
        if (moves > max_moves) return -1;
        int8_t grid[81], cur[81];
        random_grid(&rng, grid);
        memcpy(cur, grid, 81);
        minimize(&rng, cur, grid);
        int64_t r = hs_rate(cur, hidden, rate_nodes);
        int64_t d = r < 0 ? INT64_MAX : distance(r, lo, hi);
        int64_t stall = 0, since = spacing, climb = 0;
        while (emitted < count && stall < patience && moves < max_moves) {
            if (d == 0 && since >= spacing && !written(puzzles, emitted, cur)) {
                memcpy(puzzles + 81 * emitted, cur, 81);
                memcpy(solutions + 81 * emitted, grid, 81);
                ratings[emitted++] = r;
                since = stall = 0;
                if (climb <= spacing) break; /* a new grid costs no more than staying: independent puzzles */
                continue;
            }
            climb++;
            moves++;
            stall++;
            int given[81], blank[81], ng = 0, nb = 0;
            for (int i = 0; i < 81; i++) {
                if (cur[i]) given[ng++] = i;
                else blank[nb++] = i;
            }
            int8_t next_p[81];
            memcpy(next_p, cur, 81);
            next_p[given[below(&rng, ng)]] = 0;
            int add = blank[below(&rng, nb)];
            next_p[add] = grid[add];
            if (hs_count(next_p, 2, 1, INT64_MAX, 0, 0) != 1) continue;
            minimize(&rng, next_p, grid);
            int64_t r2 = hs_rate(next_p, hidden, rate_nodes);
            if (r2 < 0) continue;
            int64_t d2 = distance(r2, lo, hi);
            if (d2 <= d && memcmp(cur, next_p, 81)) {
                if (d2 < d) stall = 0;
                memcpy(cur, next_p, 81);
                r = r2;
                d = d2;
                since++;
            }
        }
        moves++;
    }
    return moves;
}
