/* The quick path of cclctl's torch.distributed wrapper, compiled.
 *
 * Same logic as the pure-Python wrapper in cclctl/integrations/torch.py (_wrap_quick),
 * which stays the fallback when this module is not built. Between two gloo calls the
 * caches hold gloo's data, and each Python step of a wrapper costs the calling thread
 * cold memory reads; this one reads the call's arguments through vectorcall (no tuple or
 * dict built), the session's parts from one tuple, and the clock with clock_gettime.
 *
 * A QuickWrapper is called exactly like the function it wraps. It hands a synchronous
 * one-tensor call on a known group to the session as a list
 * [group, tensor, op, start_ns, end_ns, error] (torch_session.QUICK_*), calls the original,
 * then marks the end; anything else goes to `general` (or `original`, where the Python
 * wrapper would too). `live` is None (no session) or a tuple
 * (comms, hand, quick, fail, fold): the session's known groups, its hand-over's append,
 * the hand-over deque, and two callables that never raise, fail(call, exc) and fold().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#define QUICK_END 4
#define LIVE_COMMS 0
#define LIVE_HAND 1
#define LIVE_QUICK 2
#define LIVE_FAIL 3
#define LIVE_FOLD 4
#define LIVE_SIZE 5

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;        /* functools.wraps writes __wrapped__, __name__, ... here */
    PyObject *live;        /* None, or the session's parts (see above) */
    PyObject *original;    /* torch's function */
    PyObject *general;     /* the general wrapper, for every other call */
    PyObject *inside;      /* set of thread idents inside a wrapped call */
    PyObject *tensor_type; /* torch.Tensor: the exact type a quick call takes */
    PyObject *op;          /* the record's op name */
    PyObject *name;        /* the tensor's keyword name */
    PyObject *group_kw;    /* "group" */
    PyObject *async_kw;    /* "async_op" */
    PyObject *is_cuda;     /* "is_cuda", read on every call where torch has CUDA */
    Py_ssize_t i_tensor, i_group, i_async, backstop;
    int gpus;              /* whether this torch can make CUDA tensors */
} QuickWrapper;

static PyObject *
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns() */
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
}

/* The argument at position i, or the keyword `kw`, or NULL (borrowed). */
static PyObject *
argument(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Py_ssize_t i,
         PyObject *kw)
{
    if (i < nargs)
        return args[i];
    if (kwnames == NULL)
        return NULL;
    Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        if (key == kw) /* keywords are interned, as are our names */
            return args[nargs + k];
    }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        if (PyUnicode_Compare(key, kw) == 0)
            return args[nargs + k];
    }
    return NULL;
}

/* Whether this call takes the general path: 1 yes, 0 no (the quick one), -1 the original. */
static int
not_quick(QuickWrapper *self, PyObject *comms, PyObject *const *args, Py_ssize_t nargs,
          PyObject *kwnames, PyObject **group_out)
{
    PyObject *tensor = argument(args, nargs, kwnames, self->i_tensor, self->name);
    if (tensor == NULL || (PyObject *)Py_TYPE(tensor) != self->tensor_type)
        return 1;
    if (self->gpus) {
        PyObject *cuda = PyObject_GetAttr(tensor, self->is_cuda);
        if (cuda == NULL) {
            PyErr_Clear();
            return 1;
        }
        int is_cuda = PyObject_IsTrue(cuda);
        Py_DECREF(cuda);
        if (is_cuda != 0) {
            PyErr_Clear();
            return 1;
        }
    }
    PyObject *async_op = argument(args, nargs, kwnames, self->i_async, self->async_kw);
    if (async_op != NULL && async_op != Py_False && async_op != Py_None) {
        int truth = PyObject_IsTrue(async_op);
        if (truth != 0) {
            PyErr_Clear();
            return 1;
        }
    }
    PyObject *group = argument(args, nargs, kwnames, self->i_group, self->group_kw);
    if (group == Py_None)
        group = NULL;
    if (group != NULL) {
        int known = PyDict_Contains(comms, group);
        if (known < 0) { /* unhashable: not a process group, and torch will say so */
            PyErr_Clear();
            return -1;
        }
        if (!known)
            return 1; /* a new group, or a non-member's */
    }
    *group_out = group != NULL ? group : Py_None;
    return 0;
}

/* A call on the quick path: hand it over, call torch, mark its end. */
static PyObject *
call_quick(QuickWrapper *self, PyObject *live, PyObject *group, PyObject *const *args,
           size_t nargsf, PyObject *kwnames)
{
    PyObject *tensor = argument(args, PyVectorcall_NARGS(nargsf), kwnames, self->i_tensor,
                                self->name);
    PyObject *call = PyList_New(6);
    PyObject *start = now_ns();
    if (call == NULL || start == NULL) {
        Py_XDECREF(call);
        Py_XDECREF(start);
        return NULL;
    }
    PyList_SET_ITEM(call, 0, Py_NewRef(group));
    PyList_SET_ITEM(call, 1, Py_NewRef(tensor));
    PyList_SET_ITEM(call, 2, Py_NewRef(self->op));
    PyList_SET_ITEM(call, 3, start);
    PyList_SET_ITEM(call, QUICK_END, PyLong_FromLong(0)); /* a cached small int */
    PyList_SET_ITEM(call, 5, Py_NewRef(Py_None));
    PyObject *handed = PyObject_CallOneArg(PyTuple_GET_ITEM(live, LIVE_HAND), call);
    if (handed == NULL) { /* a deque's append does not fail; if it did, never fail the job */
        PyErr_WriteUnraisable(self->original);
        Py_DECREF(call);
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    Py_DECREF(handed);

    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (result == NULL) { /* torch raised: record why, then raise it unchanged */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *failed = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(live, LIVE_FAIL),
                                                        call, value, NULL);
        if (failed == NULL)
            PyErr_WriteUnraisable(self->original);
        Py_XDECREF(failed);
        PyErr_Restore(type, value, tb);
        Py_DECREF(call);
        return NULL;
    }
    PyObject *end = now_ns(); /* the call has ended: its record is built and ended later */
    if (end == NULL || PyList_SetItem(call, QUICK_END, end) < 0)
        PyErr_WriteUnraisable(self->original); /* left in flight: the watchdog will say */
    else {
        Py_ssize_t waiting = PyObject_Size(PyTuple_GET_ITEM(live, LIVE_QUICK));
        if (waiting < 0)
            PyErr_WriteUnraisable(self->original);
        else if (waiting >= self->backstop) { /* the session's folder has fallen behind */
            PyObject *folded = PyObject_CallNoArgs(PyTuple_GET_ITEM(live, LIVE_FOLD));
            if (folded == NULL)
                PyErr_WriteUnraisable(self->original);
            Py_XDECREF(folded);
        }
    }
    Py_DECREF(call);
    return result;
}

/* Whether this thread is inside another wrapped call (which counts this one). */
static int
nested(QuickWrapper *self)
{
    if (PySet_GET_SIZE(self->inside) == 0)
        return 0;
    PyObject *me = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    int in = me == NULL ? -1 : PySet_Contains(self->inside, me);
    Py_XDECREF(me);
    if (in < 0) {
        PyErr_Clear();
        return 1; /* pass the call through untraced rather than fail it */
    }
    return in;
}

/* The wrapper, called as torch's function is. */
static PyObject *
quick_wrapper(QuickWrapper *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *live = self->live;
    if (live == Py_None || nested(self))
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    Py_INCREF(live); /* the session may end (and drop it) while this call runs */
    PyObject *group = NULL, *result;
    int path = not_quick(self, PyTuple_GET_ITEM(live, LIVE_COMMS), args,
                         PyVectorcall_NARGS(nargsf), kwnames, &group);
    if (path > 0)
        result = PyObject_Vectorcall(self->general, args, nargsf, kwnames);
    else if (path < 0)
        result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    else
        result = call_quick(self, live, group, args, nargsf, kwnames);
    Py_DECREF(live);
    return result;
}

static int
set_live(QuickWrapper *self, PyObject *value, void *closure)
{
    (void)closure;
    if (value == NULL || (value != Py_None && !(PyTuple_Check(value) &&
                                                PyTuple_GET_SIZE(value) == LIVE_SIZE &&
                                                PyDict_Check(PyTuple_GET_ITEM(value, 0))))) {
        PyErr_SetString(PyExc_TypeError,
                        "live must be None or (comms: dict, hand, quick, fail, fold)");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->live, value);
    return 0;
}

static PyObject *
get_live(QuickWrapper *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->live);
}

static PyGetSetDef getset[] = {
    {"live", (getter)get_live, (setter)set_live,
     "None, or the session's (comms, hand, quick, fail, fold)", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyObject *
new_wrapper(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"original", "general", "inside", "tensor_type", "op", "name",
                             "i_tensor", "i_group", "i_async", "backstop", "gpus", NULL};
    PyObject *original, *general, *inside, *tensor_type, *op, *name;
    Py_ssize_t i_tensor, i_group, i_async, backstop;
    int gpus;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!OUUnnnnp", kwlist, &original, &general,
                                     &PySet_Type, &inside, &tensor_type, &op, &name, &i_tensor,
                                     &i_group, &i_async, &backstop, &gpus))
        return NULL;
    QuickWrapper *self = (QuickWrapper *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)quick_wrapper;
    self->live = Py_NewRef(Py_None);
    self->original = Py_NewRef(original);
    self->general = Py_NewRef(general);
    self->inside = Py_NewRef(inside);
    self->tensor_type = Py_NewRef(tensor_type);
    self->op = Py_NewRef(op);
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    self->name = name;
    self->group_kw = PyUnicode_InternFromString("group");
    self->async_kw = PyUnicode_InternFromString("async_op");
    self->is_cuda = PyUnicode_InternFromString("is_cuda");
    if (self->group_kw == NULL || self->async_kw == NULL || self->is_cuda == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->i_tensor = i_tensor;
    self->i_group = i_group;
    self->i_async = i_async;
    self->backstop = backstop;
    self->gpus = gpus;
    return (PyObject *)self;
}

static int
traverse(QuickWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->live);
    Py_VISIT(self->original);
    Py_VISIT(self->general);
    Py_VISIT(self->inside);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->op);
    return 0;
}

static int
clear(QuickWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->live);
    Py_CLEAR(self->original);
    Py_CLEAR(self->general);
    Py_CLEAR(self->inside);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->op);
    Py_CLEAR(self->name);
    Py_CLEAR(self->group_kw);
    Py_CLEAR(self->async_kw);
    Py_CLEAR(self->is_cuda);
    return 0;
}

static void
dealloc(QuickWrapper *self)
{
    PyObject_GC_UnTrack(self);
    clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
repr(QuickWrapper *self)
{
    return PyUnicode_FromFormat("<cclctl quick wrapper of %R>", self->original);
}

static PyTypeObject QuickWrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cclctl.integrations._quickwrap.QuickWrapper",
    .tp_doc = "A torch.distributed collective with cclctl's quick path, compiled.",
    .tp_basicsize = sizeof(QuickWrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = new_wrapper,
    .tp_dealloc = (destructor)dealloc,
    .tp_traverse = (traverseproc)traverse,
    .tp_clear = (inquiry)clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(QuickWrapper, vectorcall),
    .tp_dictoffset = offsetof(QuickWrapper, dict),
    .tp_getset = getset,
    .tp_repr = (reprfunc)repr,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cclctl.integrations._quickwrap",
    .m_doc = "The torch wrapper's quick path, compiled (see cclctl.integrations.torch).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__quickwrap(void)
{
    if (PyType_Ready(&QuickWrapperType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&QuickWrapperType);
    if (PyModule_AddObject(m, "QuickWrapper", (PyObject *)&QuickWrapperType) < 0) {
        Py_DECREF(&QuickWrapperType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
