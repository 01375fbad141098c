/*
 * Records produced from C, with no delivery report: the loop of kafka/quiet.py.
 *
 * The producer is confluent-kafka's: its librdkafka handle is read from the Python object, and
 * librdkafka's functions are the ones confluent-kafka loaded, handed in as addresses by
 * `bind()`. The extension links no librdkafka of its own (two copies in one process would not
 * share a handle) and includes none of its headers: the four signatures below are librdkafka's
 * stable C API since 0.9.
 *
 * A record goes in with no opaque, so confluent-kafka's delivery callback returns at once for
 * it; the task proves it delivered by its partition's acknowledged count (kafka/deliveries.py).
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000 /* the stable ABI: one wheel for CPython 3.10 and later */
#include <Python.h>
#include <stdint.h>

#define MSG_F_COPY 0x2 /* RD_KAFKA_MSG_F_COPY: librdkafka copies key and value */

typedef int (*produce_fn)(void *rkt, int32_t partition, int msgflags, void *payload,
                          size_t len, const void *key, size_t keylen, void *msg_opaque);
typedef int (*last_error_fn)(void);
typedef void *(*topic_new_fn)(void *rk, const char *topic, void *conf);
typedef void (*topic_destroy_fn)(void *rkt);

static PyTypeObject *producer_type;
static produce_fn produce_record;
static last_error_fn last_error;
static topic_new_fn topic_new;
static topic_destroy_fn topic_destroy;

/* confluent-kafka's Handle (Producer, Consumer) begins with its rd_kafka_t. */
typedef struct {
    PyObject_HEAD
    void *rk;
} Handle;

/* A record's key or value: NULL for None; a bytes object's own buffer; else not taken. */
static int bytes_of(PyObject *item, char **data, Py_ssize_t *size) {
    if (item == Py_None) {
        *data = NULL;
        *size = 0;
        return 1;
    }
    return PyBytes_Check(item) && PyBytes_AsStringAndSize(item, data, size) == 0;
}

static PyObject *bind(PyObject *self, PyObject *args) {
    PyObject *type;
    unsigned long long produce, error, new_topic, destroy_topic;
    if (!PyArg_ParseTuple(args, "O!KKKK:bind", &PyType_Type, &type, &produce, &error,
                          &new_topic, &destroy_topic))
        return NULL;
    if (!produce || !error || !new_topic || !destroy_topic) {
        PyErr_SetString(PyExc_ValueError, "bind: a librdkafka function address is 0");
        return NULL;
    }
    Py_INCREF(type);
    Py_XDECREF(producer_type);
    producer_type = (PyTypeObject *)type;
    produce_record = (produce_fn)(uintptr_t)produce;
    last_error = (last_error_fn)(uintptr_t)error;
    topic_new = (topic_new_fn)(uintptr_t)new_topic;
    topic_destroy = (topic_destroy_fn)(uintptr_t)destroy_topic;
    Py_RETURN_NONE;
}

/* The producer's rd_kafka_t, or NULL with TypeError when it is not a bound Producer. */
static void *rk_of(PyObject *producer) {
    if (!producer_type) {
        PyErr_SetString(PyExc_RuntimeError, "_quiet: used before bind");
        return NULL;
    }
    if (!PyObject_TypeCheck(producer, producer_type)) {
        PyErr_SetString(PyExc_TypeError, "_quiet: not a confluent-kafka Producer");
        return NULL;
    }
    void *rk = ((Handle *)producer)->rk;
    if (!rk)
        PyErr_SetString(PyExc_RuntimeError, "_quiet: the producer is closed");
    return rk;
}

static PyObject *handle(PyObject *self, PyObject *producer) {
    void *rk = rk_of(producer);
    return rk ? PyLong_FromVoidPtr(rk) : NULL;
}

/* Produce one record of the sequences, or say why not: 0 produced; -1 not bytes or None; else
 * librdkafka's error code. */
static int produce_one(void *rkt, int partition, PyObject *values, PyObject *keys,
                       Py_ssize_t index) {
    PyObject *value = PySequence_GetItem(values, index);
    PyObject *key = keys == Py_None ? NULL : PySequence_GetItem(keys, index);
    char *value_data = NULL, *key_data = NULL;
    Py_ssize_t value_size = 0, key_size = 0;
    int taken = value && bytes_of(value, &value_data, &value_size) &&
                (keys == Py_None || (key && bytes_of(key, &key_data, &key_size)));
    int error = -1;
    if (taken)  /* librdkafka copies both before it returns: the items may go after */
        error = produce_record(rkt, partition, MSG_F_COPY, value_data, (size_t)value_size,
                               key_data, (size_t)key_size, NULL) == -1
                    ? last_error()
                    : 0;
    Py_XDECREF(value);
    Py_XDECREF(key);
    PyErr_Clear(); /* a failed GetItem or AsStringAndSize is "not taken", not an exception */
    return error;
}

/* produce(producer, topic, partition, values, keys, start, end) -> (index, error):
 * records start..end-1 of the sequences, in order. It stops at the first record librdkafka
 * refuses (error: librdkafka's code) or that is not bytes or None (error 0): index is that
 * record's, and the caller produces it its own way; (end, 0) when all went in. */
static PyObject *produce(PyObject *self, PyObject *args) {
    PyObject *producer, *values, *keys;
    const char *topic;
    int partition;
    Py_ssize_t start, end, index;
    if (!PyArg_ParseTuple(args, "OsiOOnn:produce", &producer, &topic, &partition, &values,
                          &keys, &start, &end))
        return NULL;
    void *rk = rk_of(producer);
    if (!rk)
        return NULL;
    if (!PySequence_Check(values) || (keys != Py_None && !PySequence_Check(keys))) {
        PyErr_SetString(PyExc_TypeError, "produce: values and keys must be sequences");
        return NULL;
    }
    if (start < 0 || end > PySequence_Size(values) ||
        (keys != Py_None && end > PySequence_Size(keys))) {
        PyErr_SetString(PyExc_IndexError, "produce: start or end outside the sequences");
        return NULL;
    }
    void *rkt = topic_new(rk, topic, NULL);
    if (!rkt) {
        PyErr_Format(PyExc_RuntimeError, "produce: no librdkafka topic handle for %s", topic);
        return NULL;
    }
    int error = 0;
    for (index = start; index < end; index++) {
        error = produce_one(rkt, partition, values, keys, index);
        if (error)
            break;
    }
    topic_destroy(rkt);
    return Py_BuildValue("(ni)", index, error < 0 ? 0 : error);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Take librdkafka's functions (addresses) for produce()."},
    {"handle", handle, METH_O, "The rd_kafka_t address of a confluent-kafka Producer."},
    {"produce", produce, METH_VARARGS, "Produce list records with no delivery report."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_quiet", "Records produced from C, no delivery report.", -1, methods,
};

PyMODINIT_FUNC PyInit__quiet(void) { return PyModule_Create(&module); }
