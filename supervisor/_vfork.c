/* Start a command job's program without copying the manager: vfork, set up, exec.
 *
 * A forked child shares every page of the manager copy-on-write; a vforked one shares
 * the manager itself, which waits until the child has called execve or _exit. Between
 * the two the child only makes system calls on data the manager prepared (no malloc, no
 * Python), as CPython's own _posixsubprocess does. The set-up is what a forked child
 * does before it runs a job (supervisor/forking.py): its own process group, the
 * parent-death signal and the check that the manager did not die before it was armed,
 * stdin, stdout and stderr, the job's folder, the signals at their default, unblocked.
 *
 * spawn(candidates, argv, envp, stdin, stdout, stderr, cwd, manager)
 *     -> (pid, stage, errno)
 * candidates: the paths to try, in order (the program looked up in PATH by the caller);
 * argv, envp: lists of bytes; cwd: bytes or None; manager: the pid the child must find as
 * its parent. stage is 0 if the program runs, else which step failed (STAGE_*) and errno
 * why: the child has then exited with 70 (set-up), 71 (manager gone), 126 (folder, or not
 * executable) or 127 (not found), and the caller reaps it as any child and may say why
 * in the job's stderr.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <linux/futex.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 32)
#include <sys/single_threaded.h>
#endif

enum { STAGE_RUNS, STAGE_SETUP, STAGE_ORPHANED, STAGE_CWD, STAGE_EXEC };

/* A NULL-terminated array of the bytes in `list`, borrowed from it; NULL on error. */
static char **borrow_strings(PyObject *list) {
    Py_ssize_t count = PyList_GET_SIZE(list);
    char **strings = PyMem_Calloc((size_t)count + 1, sizeof(char *));
    if (strings == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        strings[i] = PyBytes_AsString(PyList_GET_ITEM(list, i));
        if (strings[i] == NULL) {
            PyMem_Free(strings);
            return NULL;
        }
    }
    return strings;
}

/* As a forked child would exit (supervisor/forking.py), and a shell for a program. */
static int exit_status(int stage, int error) {
    switch (stage) {
    case STAGE_ORPHANED:
        return 71;
    case STAGE_SETUP:
        return 70;
    case STAGE_EXEC:
        return error == ENOENT ? 127 : 126;
    default:
        return 126; /* the job's folder cannot be entered */
    }
}

struct job {
    char **candidates, **argv, **envp;
    int stdio[3];
    const char *cwd;
    pid_t manager;
    int cgroup; /* the run's cgroup.procs, opened for writing, or -1: the child writes itself in */
    int memory; /* the run's memory cgroup's cgroup.procs (cgroup v1), or -1 */
    /* Written by the child in the memory it shares with the manager until it execs or exits. */
    volatile int stage, error;
};

/* The child's side: the set-up, then exec. It never returns: the frames above it are the
 * manager's, suspended, and must find their variables as they left them. */
static void _Py_NO_RETURN child_exec(struct job *job) {
    int stage = STAGE_SETUP;
    /* Signals are blocked: put every handled one back to its default before unblocking,
     * or a signal arriving now would run the manager's handler in this shared memory. */
    for (int signum = 1; signum < NSIG; signum++) {
        struct sigaction action;
        if (sigaction(signum, NULL, &action) != 0 || action.sa_handler == SIG_DFL)
            continue; /* (glibc's own signals cannot be looked at: they stay as they are) */
        if (action.sa_handler == SIG_IGN && signum != SIGPIPE && signum != SIGXFSZ)
            continue; /* ignored by whoever started the manager: inherited, as by a fork */
        action.sa_handler = SIG_DFL; /* Python ignores SIGPIPE and SIGXFSZ: a program must not */
        action.sa_flags = 0;
        sigemptyset(&action.sa_mask);
        sigaction(signum, &action, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    if (setpgid(0, 0) != 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        goto failed;
    if (getppid() != job->manager) {
        stage = STAGE_ORPHANED; /* it died before the parent-death signal was armed */
        goto failed;
    }
    if (job->cgroup >= 0 && write(job->cgroup, "0", 1) != 1)
        goto failed; /* into the run's cgroup before the program runs: all it starts stays there */
    if (job->memory >= 0 && write(job->memory, "0", 1) != 1)
        goto failed; /* and into its memory cgroup, whose limit it then has */
    for (int fd = 0; fd < 3; fd++)
        if (dup2(job->stdio[fd], fd) < 0)
            goto failed;
    if (job->cwd != NULL && chdir(job->cwd) != 0) {
        stage = STAGE_CWD;
        goto failed;
    }
    if (pthread_sigmask(SIG_SETMASK, &none, NULL) != 0)
        goto failed;
    stage = STAGE_EXEC;
    int reported = 0; /* as execvp: the first error that is not "no such file here" */
    for (char **path = job->candidates; *path != NULL; path++) {
        execve(*path, job->argv, job->envp);
        if (reported == 0 && errno != ENOENT && errno != ENOTDIR)
            reported = errno;
    }
    if (reported != 0)
        errno = reported;
failed:
    job->error = errno;
    job->stage = stage;
    _exit(exit_status(stage, errno));
}

/* vfork in a frame of its own, which the child leaves only through child_exec. */
static pid_t Py_NO_INLINE start(struct job *job) {
    pid_t pid = vfork();
    if (pid == 0)
        child_exec(job);
    return pid;
}

static PyObject *spawn(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *candidates, *argv, *envp, *cwd;
    struct job job = {.stage = STAGE_RUNS, .error = 0};
    int manager;
    if (!PyArg_ParseTuple(args, "O!O!O!iiiOiii", &PyList_Type, &candidates, &PyList_Type, &argv, &PyList_Type, &envp,
                          &job.stdio[0], &job.stdio[1], &job.stdio[2], &cwd, &manager, &job.cgroup, &job.memory))
        return NULL;
    if (cwd != Py_None && (job.cwd = PyBytes_AsString(cwd)) == NULL)
        return NULL; /* not bytes */
    job.manager = (pid_t)manager;
    PyObject *result = NULL;
    if ((job.candidates = borrow_strings(candidates)) != NULL && (job.argv = borrow_strings(argv)) != NULL &&
        (job.envp = borrow_strings(envp)) != NULL) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        pid_t pid = start(&job);
        int fork_error = errno;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (pid < 0) {
            errno = fork_error;
            PyErr_SetFromErrno(PyExc_OSError);
        } else {
            result = Py_BuildValue("(iii)", (int)pid, job.stage, job.error);
        }
    }
    PyMem_Free(job.candidates);
    PyMem_Free(job.argv);
    PyMem_Free(job.envp);
    return result;
}

/* -- fork_into: os.fork, with the child born in a cgroup ------------------------------------
 *
 * A child forked by os.fork starts in the manager's cgroup, and moving it into its run's
 * is a cgroup migration: without cgroup2's favordynmods, each waits for an RCU grace
 * period (milliseconds, before the job's code may run). clone3 with CLONE_INTO_CGROUP
 * makes the child in its cgroup at once. glibc has no wrapper that forks (only spawns),
 * so this is os.fork's own code with the system call in glibc's fork() place, done as
 * glibc's fork does it: the child's thread id written into glibc's thread descriptor
 * (CLONE_CHILD_SETTID, at the address glibc's fork gives), its robust-futex list
 * registered again. What glibc's fork does besides (its atfork handlers, resetting its
 * locks) matters only where other threads may hold those locks: used only in a process of
 * one thread, and only where the descriptor's layout is the one checked below; else
 * OSError(ENOTSUP), and the caller forks with os.fork. */

/* The address of glibc's copy of this thread's id: in its thread descriptor, 16 bytes
 * before the robust list head it registered with the kernel (tid, an unused pid, the
 * list's prev pointer, then the head), checked to hold our id. NULL if it does not. */
static pid_t *thread_id_slot(struct robust_list_head **head, size_t *size) {
    if (syscall(SYS_get_robust_list, 0, head, size) != 0 || *head == NULL || *size != sizeof(**head))
        return NULL;
    pid_t *slot = (pid_t *)((char *)*head - 2 * sizeof(pid_t) - sizeof(void *));
    return *slot == (pid_t)syscall(SYS_gettid) ? slot : NULL;
}

static int one_thread(void) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 32)
    if (__libc_single_threaded)
        return 1; /* no thread was ever started in this process: nothing to count */
#endif
    DIR *tasks = opendir("/proc/self/task");
    if (tasks == NULL)
        return 0;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(tasks)) != NULL)
        count += entry->d_name[0] != '.';
    closedir(tasks);
    return count == 1;
}

static PyObject *fork_into(PyObject *module, PyObject *args) {
    (void)module;
    int cgroup;
    if (!PyArg_ParseTuple(args, "i", &cgroup))
        return NULL;
    struct robust_list_head *head;
    size_t size;
    pid_t *tid = thread_id_slot(&head, &size);
    if (tid == NULL || !one_thread()) {
        errno = ENOTSUP;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (PySys_Audit("os.fork", NULL) < 0)
        return NULL;
    struct clone_args clone = {
        .flags = CLONE_INTO_CGROUP | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID,
        .child_tid = (uint64_t)(uintptr_t)tid,
        .exit_signal = SIGCHLD,
        .cgroup = (uint64_t)cgroup,
    };
    PyOS_BeforeFork();
    pid_t pid = (pid_t)syscall(SYS_clone3, &clone, sizeof clone);
    int error = errno;
    if (pid == 0) {
        syscall(SYS_set_robust_list, head, size); /* the kernel gives a new process none */
        PyOS_AfterFork_Child();
    } else {
        PyOS_AfterFork_Parent();
    }
    if (pid < 0) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong((long)pid);
}

static PyMethodDef methods[] = {
    {"spawn", spawn, METH_VARARGS, "vfork, set up and exec a command job's program; (pid, stage, errno)"},
    {"fork_into", fork_into, METH_VARARGS, "os.fork, the child born in the cgroup whose folder is open as the argument"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "supervisor._vfork", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__vfork(void) {
    PyObject *created = PyModule_Create(&module);
    if (created == NULL)
        return NULL;
    const struct { const char *name; int value; } stages[] = {
        {"STAGE_RUNS", STAGE_RUNS}, {"STAGE_SETUP", STAGE_SETUP}, {"STAGE_ORPHANED", STAGE_ORPHANED},
        {"STAGE_CWD", STAGE_CWD}, {"STAGE_EXEC", STAGE_EXEC},
    };
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        if (PyModule_AddIntConstant(created, stages[i].name, stages[i].value) != 0) {
            Py_DECREF(created);
            return NULL;
        }
    }
    return created;
}
