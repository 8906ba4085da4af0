/* prefix_router.routing._lru: the compiled build's LRU of one worker's blocks in the prefix index.
 *
 * BlockLRU: an ordered map of blocks (ints of magnitude below 2^64: any 64-bit hash, signed or not) to
 * stamps (floats), least recent first, with the part of OrderedDict's interface the index uses: len, in,
 * [], get, [] =, del, pop, move_to_end, popitem, iteration over keys, items and values (least recent
 * first; a change of order or size while iterating raises RuntimeError), copy and pickle. Setting a
 * present block changes its stamp and keeps its place, as in an OrderedDict. Stored unboxed: the slots
 * (key, stamp, links of a doubly linked list) in arrays, found by an open-addressed table of slot numbers
 * (linear probing, deletion by backward shift, at most half full).
 * The arrays grow by doubling and never shrink: a worker's LRU takes the memory of its largest size, which
 * the index bounds by the worker's capacity.
 *
 * touch(lru, holders, value, blocks, stamp): the index's touch of any blocks (index.touch_py, the
 * reference): deepest first, each moved to the most recent end, or added (its holders' bit ``value`` set)
 * if absent; stamped ``stamp``.
 *
 * evict(lru, holders, value, count): the index's eviction (index.evict_py, the reference): the ``count``
 * least recent blocks dropped, each one's holders' bit ``value`` cleared (a block left with none removed
 * from ``holders``).
 *
 * touch_chain(lru, holders, value, blocks, held, stamp) -> int: the index's touch of one chain on a
 * chain-closed worker (index.touch_chain_py on an OrderedDict, the reference it is held to by a property
 * test): blocks touched deepest first, the ``len(blocks) - held`` deepest ones added (their holders' bit
 * ``value`` set) or, found held after all, moved; the ``held`` leading ones moved to the most recent end;
 * every one stamped ``stamp``. Returns how many of the deepest ones were found held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NONE (-1)

typedef struct {
    uint64_t magnitude;
    int negative;
} Key;

static inline int same(Key a, Key b) { return a.magnitude == b.magnitude && a.negative == b.negative; }

typedef struct {
    PyObject_HEAD
    Key *keys;        /* per slot */
    double *stamps;   /* per slot */
    int32_t *prev;    /* per slot: the next less recent slot, NONE at the least recent */
    int32_t *next;    /* per slot: the next more recent slot (or the next free one), NONE at the end */
    int32_t *table;   /* 2 x slots positions: a slot number or NONE */
    Py_ssize_t slots; /* allocated slots, a power of two (0 before the first insert) */
    Py_ssize_t top;   /* slots handed out so far; those below it not in the list are on the free list */
    Py_ssize_t len;
    int32_t head, tail, free;
    uint64_t version; /* changed by every change of order or size (iterators check it) */
} LRUObject;

typedef struct {
    PyObject_HEAD
    LRUObject *lru;
    int32_t slot;
    uint64_t version;
    int kind; /* 0 keys, 1 values, 2 items */
} IterObject;

static PyTypeObject LRUType;
static PyTypeObject IterType;

static inline size_t bucket(Key key, Py_ssize_t slots) {
    uint64_t h = (key.magnitude ^ (uint64_t)key.negative) * 0x9E3779B97F4A7C15ULL; /* small ints spread */
    h ^= h >> 29;
    return (size_t)h & (size_t)(2 * slots - 1);
}

/* The block as a key: 1 and *out set, 0 when it is no such key (not an int, or out of range; no error
 * left), -1 on another error. CPython 3.11 keeps an int as 30-bit digits with the sign in its size: read
 * directly (PyLong_AsUnsignedLongLong goes through a byte array, half of a touch's time); elsewhere the
 * published call. */
static inline int as_key(PyObject *block, Key *out) {
    if (!PyLong_Check(block)) return 0;
#if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    Py_ssize_t size = Py_SIZE(block), ndigits = size < 0 ? -size : size;
    if (ndigits > 3) return 0;
    const digit *digits = ((PyLongObject *)block)->ob_digit;
    if (ndigits == 3 && digits[2] >> 4) return 0; /* a magnitude of 2**64 or more */
    uint64_t value = 0;
    for (Py_ssize_t i = ndigits; i-- > 0;) value = value << PyLong_SHIFT | digits[i];
    out->magnitude = value, out->negative = size < 0;
    return 1;
#else
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) return -1;
    int negative = PyObject_RichCompareBool(block, zero, Py_LT);
    Py_DECREF(zero);
    if (negative < 0) return -1;
    PyObject *magnitude = negative ? PyNumber_Negative(block) : Py_NewRef(block);
    if (magnitude == NULL) return -1;
    unsigned long long value = PyLong_AsUnsignedLongLong(magnitude);
    Py_DECREF(magnitude);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        return 0;
    }
    out->magnitude = (uint64_t)value, out->negative = negative;
    return 1;
#endif
}

/* as_key for a block to store: an error set when it cannot be one. */
static int store_key(PyObject *block, Key *out) {
    int ok = as_key(block, out);
    if (ok == 0) PyErr_SetString(PyExc_TypeError, "BlockLRU: a block is an int of magnitude below 2**64");
    return ok == 1 ? 0 : -1;
}

/* The table position holding key, or NONE. */
static Py_ssize_t find(LRUObject *o, Key key) {
    if (o->slots == 0) return NONE;
    size_t mask = (size_t)(2 * o->slots - 1), pos = bucket(key, o->slots);
    for (;;) {
        int32_t slot = o->table[pos];
        if (slot == NONE) return NONE;
        if (same(o->keys[slot], key)) return (Py_ssize_t)pos;
        pos = (pos + 1) & mask;
    }
}

static void place(LRUObject *o, int32_t slot) {
    size_t mask = (size_t)(2 * o->slots - 1), pos = bucket(o->keys[slot], o->slots);
    while (o->table[pos] != NONE) pos = (pos + 1) & mask;
    o->table[pos] = slot;
}

static void unlink_slot(LRUObject *o, int32_t slot) {
    int32_t p = o->prev[slot], n = o->next[slot];
    if (p != NONE) o->next[p] = n; else o->head = n;
    if (n != NONE) o->prev[n] = p; else o->tail = p;
}

static void link_last(LRUObject *o, int32_t slot) {
    o->prev[slot] = o->tail, o->next[slot] = NONE;
    if (o->tail != NONE) o->next[o->tail] = slot; else o->head = slot;
    o->tail = slot;
}

static void link_first(LRUObject *o, int32_t slot) {
    o->next[slot] = o->head, o->prev[slot] = NONE;
    if (o->head != NONE) o->prev[o->head] = slot; else o->tail = slot;
    o->head = slot;
}

static int grow(LRUObject *o) {
    Py_ssize_t slots = o->slots ? 2 * o->slots : 8;
    if (slots > ((Py_ssize_t)1 << 30)) {
        PyErr_SetString(PyExc_OverflowError, "BlockLRU: too many blocks");
        return -1;
    }
    Key *keys = PyMem_Realloc(o->keys, (size_t)slots * sizeof(Key));
    if (keys) o->keys = keys;
    double *stamps = PyMem_Realloc(o->stamps, (size_t)slots * sizeof(double));
    if (stamps) o->stamps = stamps;
    int32_t *prev = PyMem_Realloc(o->prev, (size_t)slots * sizeof(int32_t));
    if (prev) o->prev = prev;
    int32_t *next = PyMem_Realloc(o->next, (size_t)slots * sizeof(int32_t));
    if (next) o->next = next;
    int32_t *table = PyMem_Malloc((size_t)(2 * slots) * sizeof(int32_t));
    if (!keys || !stamps || !prev || !next || !table) {
        PyMem_Free(table);
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(o->table);
    o->table = table, o->slots = slots;
    for (Py_ssize_t i = 0; i < 2 * slots; i++) table[i] = NONE;
    for (int32_t slot = o->head; slot != NONE; slot = o->next[slot]) place(o, slot);
    return 0;
}

/* A new slot for key at the most recent end; -1 on an error. */
static int32_t add(LRUObject *o, Key key, double stamp) {
    int32_t slot;
    if (o->free != NONE) {
        slot = o->free, o->free = o->next[slot];
    } else {
        if (o->top == o->slots && grow(o) < 0) return NONE;
        slot = (int32_t)o->top++;
    }
    o->keys[slot] = key, o->stamps[slot] = stamp;
    place(o, slot);
    link_last(o, slot);
    o->len++, o->version++;
    return slot;
}

/* Remove the entry at table position pos (backward-shift deletion keeps every probe run unbroken). */
static void drop(LRUObject *o, Py_ssize_t pos) {
    size_t mask = (size_t)(2 * o->slots - 1), hole = (size_t)pos, at = (size_t)pos;
    int32_t slot = o->table[pos];
    unlink_slot(o, slot);
    o->next[slot] = o->free, o->free = slot;
    o->len--, o->version++;
    o->table[hole] = NONE;
    for (;;) {
        at = (at + 1) & mask;
        int32_t moved = o->table[at];
        if (moved == NONE) return;
        size_t home = bucket(o->keys[moved], o->slots);
        /* moved stays when its home lies cyclically after the hole and up to its position (a lookup
         * from its home does not pass the hole); else it fills the hole, which moves to its position */
        int stays = hole <= at ? (home > hole && home <= at) : (home > hole || home <= at);
        if (!stays) {
            o->table[hole] = moved, o->table[at] = NONE;
            hole = at;
        }
    }
}

static void to_end(LRUObject *o, int32_t slot) {
    if (o->tail == slot) return;
    unlink_slot(o, slot);
    link_last(o, slot);
    o->version++;
}

/* lru[block] = stamp: a present block keeps its place. 0, or -1 on an error. */
static int set_stamp(LRUObject *o, PyObject *block, double stamp) {
    Key key;
    if (store_key(block, &key) < 0) return -1;
    Py_ssize_t pos = find(o, key);
    if (pos != NONE) {
        o->stamps[o->table[pos]] = stamp;
        return 0;
    }
    return add(o, key, stamp) == NONE ? -1 : 0;
}

/* ------------------------------------------------------------------ the mapping */

static PyObject *lru_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "BlockLRU() takes no arguments");
        return NULL;
    }
    LRUObject *o = (LRUObject *)type->tp_alloc(type, 0);
    if (o == NULL) return NULL;
    o->head = o->tail = o->free = NONE;
    return (PyObject *)o;
}

static void lru_dealloc(LRUObject *o) {
    PyMem_Free(o->keys), PyMem_Free(o->stamps), PyMem_Free(o->prev), PyMem_Free(o->next);
    PyMem_Free(o->table);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static Py_ssize_t lru_len(LRUObject *o) { return o->len; }

/* The table position of block, NONE when absent or no block (no error), or -2 on an error. */
static Py_ssize_t pos_of(LRUObject *o, PyObject *block) {
    Key key;
    int ok = as_key(block, &key);
    return ok < 0 ? -2 : ok ? find(o, key) : NONE;
}

/* The slot of block, NONE when absent (no error), or -2 on an error. */
static Py_ssize_t slot_of(LRUObject *o, PyObject *block) {
    Py_ssize_t pos = pos_of(o, block);
    return pos < 0 ? pos : o->table[pos];
}

static int lru_contains(LRUObject *o, PyObject *block) {
    Py_ssize_t slot = slot_of(o, block);
    return slot == -2 ? -1 : slot != NONE;
}

static PyObject *lru_getitem(LRUObject *o, PyObject *block) {
    Py_ssize_t slot = slot_of(o, block);
    if (slot == -2) return NULL;
    if (slot == NONE) {
        PyErr_SetObject(PyExc_KeyError, block);
        return NULL;
    }
    return PyFloat_FromDouble(o->stamps[slot]);
}

static int lru_setitem(LRUObject *o, PyObject *block, PyObject *value) {
    if (value != NULL) {
        double stamp = PyFloat_AsDouble(value);
        if (stamp == -1.0 && PyErr_Occurred()) return -1;
        return set_stamp(o, block, stamp);
    }
    Py_ssize_t pos = pos_of(o, block);
    if (pos == NONE) PyErr_SetObject(PyExc_KeyError, block);
    if (pos < 0) return -1;
    drop(o, pos);
    return 0;
}

static int one_or_two(const char *name, Py_ssize_t nargs) {
    if (nargs == 1 || nargs == 2) return 0;
    PyErr_Format(PyExc_TypeError, "%s(block[, default])", name);
    return -1;
}

static PyObject *lru_get(LRUObject *o, PyObject *const *args, Py_ssize_t nargs) {
    if (one_or_two("get", nargs) < 0) return NULL;
    Py_ssize_t slot = slot_of(o, args[0]);
    if (slot == -2) return NULL;
    if (slot != NONE) return PyFloat_FromDouble(o->stamps[slot]);
    return Py_NewRef(nargs > 1 ? args[1] : Py_None);
}

static PyObject *lru_pop(LRUObject *o, PyObject *const *args, Py_ssize_t nargs) {
    if (one_or_two("pop", nargs) < 0) return NULL;
    Py_ssize_t pos = pos_of(o, args[0]);
    if (pos == -2) return NULL;
    if (pos == NONE) {
        if (nargs > 1) return Py_NewRef(args[1]);
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *stamp = PyFloat_FromDouble(o->stamps[o->table[pos]]);
    if (stamp != NULL) drop(o, pos);
    return stamp;
}

static int last_flag(const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const usage = "%s(%slast=True)";
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int key = strcmp(name, "move_to_end") == 0;
    if (nargs + nkw > key + 1 || nargs < key ||
        (nkw == 1 && !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))) ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "last") != 0)) {
        PyErr_Format(PyExc_TypeError, usage, name, key ? "block, " : "");
        return -1;
    }
    return nargs + nkw > key ? PyObject_IsTrue(args[key]) : 1;
}

static PyObject *lru_move_to_end(LRUObject *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    int last = last_flag("move_to_end", args, nargs, kwnames);
    if (last < 0) return NULL;
    Py_ssize_t slot = slot_of(o, args[0]);
    if (slot == -2) return NULL;
    if (slot == NONE) {
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    if (last) {
        to_end(o, (int32_t)slot);
    } else if (o->head != slot) {
        unlink_slot(o, (int32_t)slot);
        link_first(o, (int32_t)slot);
        o->version++;
    }
    Py_RETURN_NONE;
}

static PyObject *key_object(Key key) {
    PyObject *magnitude = PyLong_FromUnsignedLongLong(key.magnitude);
    if (magnitude == NULL || !key.negative) return magnitude;
    PyObject *value = PyNumber_Negative(magnitude);
    Py_DECREF(magnitude);
    return value;
}

static PyObject *item_of(LRUObject *o, int32_t slot) {
    PyObject *key = key_object(o->keys[slot]);
    return key == NULL ? NULL : Py_BuildValue("(Nd)", key, o->stamps[slot]);
}

static PyObject *lru_popitem(LRUObject *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    int last = last_flag("popitem", args, nargs, kwnames);
    if (last < 0) return NULL;
    if (o->len == 0) {
        PyErr_SetString(PyExc_KeyError, "dictionary is empty");
        return NULL;
    }
    int32_t slot = last ? o->tail : o->head;
    PyObject *item = item_of(o, slot);
    if (item != NULL) drop(o, find(o, o->keys[slot]));
    return item;
}

static PyObject *iterate(LRUObject *o, int kind) {
    IterObject *it = PyObject_New(IterObject, &IterType);
    if (it == NULL) return NULL;
    it->lru = (LRUObject *)Py_NewRef(o);
    it->slot = o->head, it->version = o->version, it->kind = kind;
    return (PyObject *)it;
}

static PyObject *lru_iter(LRUObject *o) { return iterate(o, 0); }
static PyObject *lru_keys(LRUObject *o, PyObject *unused) { (void)unused; return iterate(o, 0); }
static PyObject *lru_values(LRUObject *o, PyObject *unused) { (void)unused; return iterate(o, 1); }
static PyObject *lru_items(LRUObject *o, PyObject *unused) { (void)unused; return iterate(o, 2); }

/* For copy and pickle: rebuilt empty, then given its items in order (``lru[block] = stamp``). */
static PyObject *lru_reduce(LRUObject *o, PyObject *unused) {
    (void)unused;
    PyObject *items = iterate(o, 2);
    return items == NULL ? NULL : Py_BuildValue("(O()OON)", (PyObject *)Py_TYPE(o), Py_None, Py_None, items);
}

/* ------------------------------------------------------------------ iteration */

static void iter_dealloc(IterObject *it) {
    Py_DECREF(it->lru);
    PyObject_Free(it);
}

static PyObject *iter_next(IterObject *it) {
    LRUObject *o = it->lru;
    if (it->version != o->version) {
        PyErr_SetString(PyExc_RuntimeError, "BlockLRU changed during iteration");
        return NULL;
    }
    int32_t slot = it->slot;
    if (slot == NONE) return NULL;
    it->slot = o->next[slot];
    if (it->kind == 0) return key_object(o->keys[slot]);
    if (it->kind == 1) return PyFloat_FromDouble(o->stamps[slot]);
    return item_of(o, slot);
}

/* ------------------------------------------------------------------ the index's loops */

/* holders[block] = mask | value, mask its holders so far (NULL: none). 0, or -1 on an error. */
static int hold_over(PyObject *holders, PyObject *value, PyObject *block, PyObject *mask) {
    PyObject *mine = mask != NULL ? PyNumber_Or(mask, value) : Py_NewRef(value);
    if (mine == NULL) return -1;
    int failed = PyDict_SetItem(holders, block, mine);
    Py_DECREF(mine);
    return failed;
}

/* holders[block] |= value. 0, or -1 on an error. */
static int hold(PyObject *holders, PyObject *value, PyObject *block) {
    PyObject *mask = PyDict_GetItemWithError(holders, block); /* borrowed */
    if (mask == NULL && PyErr_Occurred()) return -1;
    return hold_over(holders, value, block, mask);
}

/* block stamped and moved to the most recent end; added there if absent, and then, given holders, its
 * holders' bit value set. 0, or -1 on an error. */
static int touch_one(LRUObject *o, PyObject *block, double stamp, PyObject *holders, PyObject *value) {
    Key key;
    if (store_key(block, &key) < 0) return -1;
    Py_ssize_t pos = find(o, key);
    if (pos == NONE) {
        if (holders != NULL && hold(holders, value, block) < 0) return -1;
        return add(o, key, stamp) == NONE ? -1 : 0;
    }
    int32_t slot = o->table[pos];
    o->stamps[slot] = stamp;
    to_end(o, slot);
    return 0;
}

/* One of the deepest blocks: added (holders[block] |= value) unless held, else moved; stamped. Returns
 * 1 if it was held, 0 if added, -1 on an error. */
static int touch_deep(LRUObject *o, PyObject *holders, PyObject *value, PyObject *block, double stamp) {
    PyObject *mask = PyDict_GetItemWithError(holders, block); /* borrowed */
    if (mask == NULL && PyErr_Occurred()) return -1;
    int held = 0;
    if (mask != NULL) {
        PyObject *both = PyNumber_And(mask, value);
        if (both == NULL) return -1;
        held = PyObject_IsTrue(both);
        Py_DECREF(both);
        if (held < 0) return -1;
    }
    if (held) { /* moved (a KeyError, as in the reference, should it be absent), then stamped */
        Py_ssize_t slot = slot_of(o, block);
        if (slot == -2) return -1;
        if (slot == NONE) {
            PyErr_SetObject(PyExc_KeyError, block);
            return -1;
        }
        to_end(o, (int32_t)slot);
        o->stamps[slot] = stamp;
        return 1;
    }
    return hold_over(holders, value, block, mask) < 0 || set_stamp(o, block, stamp) < 0 ? -1 : 0;
}

/* The arguments the index's loops share, checked: their number, then the LRU, the holders and the bit. */
static LRUObject *loop_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, const char *usage) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s", usage);
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], &LRUType) || !PyDict_CheckExact(args[1]) || !PyLong_Check(args[2])) {
        PyErr_Format(PyExc_TypeError, "%s: a BlockLRU, a dict and an int bit", usage);
        return NULL;
    }
    return (LRUObject *)args[0];
}

static int read_stamp(PyObject *arg, double *stamp) {
    *stamp = PyFloat_AsDouble(arg);
    return *stamp == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *touch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    LRUObject *o = loop_args(args, nargs, 5, "touch(lru, holders, value, blocks, stamp)");
    double stamp;
    if (o == NULL || read_stamp(args[4], &stamp) < 0) return NULL;
    PyObject *seq = PySequence_Fast(args[3], "touch: blocks must be a sequence");
    if (seq == NULL) return NULL;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = PySequence_Fast_GET_SIZE(seq) - 1; i >= 0; i--) {
        if (touch_one(o, items[i], stamp, args[1], args[2]) < 0) goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* holders[block] &= ~value, or the block removed once no bit is left. 0, or -1 on an error. */
static int unhold(PyObject *holders, PyObject *cleared, PyObject *block) {
    PyObject *mask = PyDict_GetItemWithError(holders, block); /* borrowed */
    if (mask == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *left = PyNumber_And(mask, cleared);
    if (left == NULL) return -1;
    int any = PyObject_IsTrue(left);
    int failed = any < 0 ? -1 : any ? PyDict_SetItem(holders, block, left) : PyDict_DelItem(holders, block);
    Py_DECREF(left);
    return failed;
}

static PyObject *evict(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    LRUObject *o = loop_args(args, nargs, 4, "evict(lru, holders, value, count)");
    if (o == NULL) return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    PyObject *cleared = PyNumber_Invert(args[2]);
    if (cleared == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (o->len == 0) {
            PyErr_SetString(PyExc_KeyError, "dictionary is empty");
            goto fail;
        }
        Key key = o->keys[o->head];
        PyObject *block = key_object(key);
        if (block == NULL) goto fail;
        drop(o, find(o, key));
        int failed = unhold(args[1], cleared, block);
        Py_DECREF(block);
        if (failed < 0) goto fail;
    }
    Py_DECREF(cleared);
    Py_RETURN_NONE;
fail:
    Py_DECREF(cleared);
    return NULL;
}

static PyObject *touch_chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    LRUObject *o = loop_args(args, nargs, 6, "touch_chain(lru, holders, value, blocks, held, stamp)");
    double stamp;
    if (o == NULL || read_stamp(args[5], &stamp) < 0) return NULL;
    PyObject *holders = args[1], *value = args[2];
    Py_ssize_t held = PyLong_AsSsize_t(args[4]);
    if (held == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[3], "touch_chain: blocks must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (held < 0 || held > n) {
        PyErr_SetString(PyExc_ValueError, "touch_chain: 0 <= held <= len(blocks)");
        goto fail;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t found = 0, i = n - 1;
    for (; i >= held; i--) { /* deepest first: expected not held (the worker is chain-closed), added */
        int was = touch_deep(o, holders, value, items[i], stamp);
        if (was < 0) goto fail;
        found += was;
    }
    for (; i >= 0; i--) { /* then the held prefix: moved to the most recent end */
        if (touch_one(o, items[i], stamp, NULL, NULL) < 0) goto fail;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(found);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* ------------------------------------------------------------------ types and module */

static PyMappingMethods lru_mapping = {
    (lenfunc)lru_len, (binaryfunc)lru_getitem, (objobjargproc)lru_setitem,
};

static PySequenceMethods lru_sequence = {
    .sq_contains = (objobjproc)lru_contains,
};

static PyMethodDef lru_methods[] = {
    {"get", (PyCFunction)(void (*)(void))lru_get, METH_FASTCALL, "The block's stamp, or the default."},
    {"pop", (PyCFunction)(void (*)(void))lru_pop, METH_FASTCALL, "Remove the block; its stamp."},
    {"move_to_end", (PyCFunction)(void (*)(void))lru_move_to_end, METH_FASTCALL | METH_KEYWORDS,
     "Move the block to the most recent end (last=False: the least recent end)."},
    {"popitem", (PyCFunction)(void (*)(void))lru_popitem, METH_FASTCALL | METH_KEYWORDS,
     "Remove and return the most recent (block, stamp); last=False: the least recent."},
    {"keys", (PyCFunction)lru_keys, METH_NOARGS, "The blocks, least recent first."},
    {"values", (PyCFunction)lru_values, METH_NOARGS, "The stamps, least recent first."},
    {"items", (PyCFunction)lru_items, METH_NOARGS, "(block, stamp) pairs, least recent first."},
    {"__reduce__", (PyCFunction)lru_reduce, METH_NOARGS, "For copy and pickle."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LRUType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prefix_router.routing._lru.BlockLRU",
    .tp_basicsize = sizeof(LRUObject),
    .tp_dealloc = (destructor)lru_dealloc,
    .tp_as_sequence = &lru_sequence,
    .tp_as_mapping = &lru_mapping,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An ordered map of blocks to stamps, least recent first (see the module's comment).",
    .tp_iter = (getiterfunc)lru_iter,
    .tp_methods = lru_methods,
    .tp_new = lru_new,
};

static PyTypeObject IterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prefix_router.routing._lru.BlockLRUIterator",
    .tp_basicsize = sizeof(IterObject),
    .tp_dealloc = (destructor)iter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iter_next,
};

static PyMethodDef methods[] = {
    {"evict", (PyCFunction)(void (*)(void))evict, METH_FASTCALL,
     "The prefix index's eviction of the least recent blocks (index.evict_py)."},
    {"touch", (PyCFunction)(void (*)(void))touch, METH_FASTCALL,
     "The prefix index's touch of any blocks (index.touch_py)."},
    {"touch_chain", (PyCFunction)(void (*)(void))touch_chain, METH_FASTCALL,
     "The prefix index's touch of one chain on a chain-closed worker (index.touch_chain_py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lru", NULL, 0, methods};

PyMODINIT_FUNC PyInit__lru(void) {
    if (PyType_Ready(&LRUType) < 0 || PyType_Ready(&IterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "BlockLRU", (PyObject *)&LRUType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
