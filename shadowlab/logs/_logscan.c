/* shadowlab.logs._logscan: the optional C accelerator of the log parser, the module itself.
 *
 *   scan()    _logscan_scan.c: a block's candidate lines as event records (logparse's fast path)
 *   fold_*()  _logscan_fold.c: `shadowlab logs`' replay of a b11434 log, no Python object per line
 *   sort_q(), merge_q(), bin_outcomes()  _logscan_figures.c: the figures over every request
 *
 * _logscan.h says what the files share; _logscan_constants.h (generated from
 * shadowlab/logs/accel.py) holds the facts they share with the Python. */
#include "_logscan.h"

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(body, lo, hi, base_line, base_offset, classes, strings, search=0) -> "
                                 "(events, slow, newlines, candidates, ignored, counts)"},
    {"fold_new", fold_new, METH_VARARGS, "fold_new(rows, server_json=None, slot=None, since=None, until=None, search=0) "
                                         "-> the state of one server's fold"},
    {"fold_block", fold_block, METH_VARARGS, "fold_block(state, body, lo, n, base_line, base_offset, piece_line=0) -> "
                                             "newlines | (start, stop, line_no, word) | str"},
    {"fold_events", fold_events, METH_VARARGS, "fold_events(state, body, n, base_offset, [(kind, event), ...]) -> "
                                               "None | str"},
    {"fold_finish", fold_finish, METH_VARARGS, "fold_finish(state) -> dict | str"},
    {"fold_trace", fold_trace, METH_VARARGS, "fold_trace(state, fd=-1, least=0) -> (bytes or None, lines): the trace lines since the last call, written to fd if given (once least bytes wait)"},
    {"hecking_all", hecking_all, METH_VARARGS, "hecking_all(body, lo, hi, variant) -> [offset, ...]: the side notes' "
                                               "word, by one search variant (for the tests)"},
    {"sort_q", sort_q, METH_O, "sort_q(a): sorts an array('q') in place"},
    {"merge_q", merge_q, METH_VARARGS, "merge_q(a, n): a[:n] and a[n:] ascending -> a ascending, in place"},
    {"bin_outcomes", bin_outcomes, METH_VARARGS, "bin_outcomes(times, codes, nbins, noutcomes) -> (start, width, bins)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shadowlab.logs._logscan",
    .m_doc = "The log parser's whole-line fast path in C; shadowlab/logs/parse.py is the specification.",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__logscan(void)
{
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init(); /* before __builtin_cpu_supports, as GCC documents */
#endif
    fold_init();
    PyObject *m = PyModule_Create(&module);
    /* logparse.py uses this module only when ABI is the one it was written for: a stale build
     * left in the tree after an update must not mislabel fields */
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", LOGSCAN_ABI) < 0)
        Py_CLEAR(m);
    return m;
}
