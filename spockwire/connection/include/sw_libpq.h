/* The libpq functions the batch pumps call, resolved at run time from the libpq psycopg2 itself uses.
 *
 * The pumps drive psycopg2's connection handle (PGconn *), which is only sound through the very libpq that made
 * it: the system's when psycopg2 was built from source, the private copy psycopg2-binary bundles otherwise. So
 * the module links no libpq at all: sw_libpq_bind() takes a dlopen() handle of psycopg2's extension module and
 * looks every function up with dlsym(), which searches that module and then the libraries it depends on, i.e.
 * psycopg2's own libpq. Call sites keep the libpq names (macros for the function pointers below).
 *
 * The types are opaque and the enum values are libpq's stable ABI (libpq-fe.h, unchanged since PostgreSQL 9.x).
 */
#ifndef SW_LIBPQ_H
#define SW_LIBPQ_H

#include <dlfcn.h>
#include <stddef.h>

typedef struct pg_conn PGconn;
typedef struct pg_result PGresult;
typedef struct pg_cancel PGcancel;

typedef enum {
    PGRES_EMPTY_QUERY = 0,
    PGRES_COMMAND_OK,
    PGRES_TUPLES_OK,
    PGRES_COPY_OUT,
    PGRES_COPY_IN,
    PGRES_BAD_RESPONSE,
    PGRES_NONFATAL_ERROR,
    PGRES_FATAL_ERROR,
    PGRES_COPY_BOTH
} ExecStatusType;

#define PG_DIAG_SQLSTATE 'C'

/* X(return type, name, parameter list) for every function the pumps use */
#define SW_LIBPQ_FUNCTIONS(X)                                                    \
    X(int, PQgetCopyData, (PGconn *conn, char **buffer, int async_))             \
    X(int, PQputCopyData, (PGconn *conn, const char *buffer, int nbytes))        \
    X(int, PQputCopyEnd, (PGconn *conn, const char *errormsg))                   \
    X(int, PQsetnonblocking, (PGconn *conn, int arg))                            \
    X(int, PQisBusy, (PGconn *conn))                                             \
    X(int, PQsendQuery, (PGconn *conn, const char *query))                       \
    X(PGcancel *, PQgetCancel, (PGconn *conn))                                   \
    X(int, PQcancel, (PGcancel *cancel, char *errbuf, int errbufsize))           \
    X(void, PQfreeCancel, (PGcancel *cancel))                                    \
    X(int, PQflush, (PGconn *conn))                                              \
    X(int, PQconsumeInput, (PGconn *conn))                                       \
    X(int, PQsocket, (const PGconn *conn))                                       \
    X(void, PQfreemem, (void *ptr))                                              \
    X(PGresult *, PQgetResult, (PGconn *conn))                                   \
    X(ExecStatusType, PQresultStatus, (const PGresult *res))                     \
    X(char *, PQresultErrorMessage, (const PGresult *res))                       \
    X(char *, PQresultErrorField, (const PGresult *res, int fieldcode))          \
    X(char *, PQerrorMessage, (const PGconn *conn))                              \
    X(void, PQclear, (PGresult *res))

#define SW_LIBPQ_POINTER(ret, name, params) static ret (*sw_##name) params = NULL;
SW_LIBPQ_FUNCTIONS(SW_LIBPQ_POINTER)
#undef SW_LIBPQ_POINTER

#define PQgetCopyData sw_PQgetCopyData
#define PQputCopyData sw_PQputCopyData
#define PQputCopyEnd sw_PQputCopyEnd
#define PQsetnonblocking sw_PQsetnonblocking
#define PQisBusy sw_PQisBusy
#define PQsendQuery sw_PQsendQuery
#define PQgetCancel sw_PQgetCancel
#define PQcancel sw_PQcancel
#define PQfreeCancel sw_PQfreeCancel
#define PQflush sw_PQflush
#define PQconsumeInput sw_PQconsumeInput
#define PQsocket sw_PQsocket
#define PQfreemem sw_PQfreemem
#define PQgetResult sw_PQgetResult
#define PQresultStatus sw_PQresultStatus
#define PQresultErrorMessage sw_PQresultErrorMessage
#define PQresultErrorField sw_PQresultErrorField
#define PQerrorMessage sw_PQerrorMessage
#define PQclear sw_PQclear

static void *sw_libpq_handle = NULL;

/* Look every function up through `handle` (a dlopen() handle); on success keep the handle and return NULL, else
   return the name of the first function that was not found (nothing is bound then). */
static const char *sw_libpq_bind(void *handle) {
    void *found;
#define SW_LIBPQ_CHECK(ret, name, params) \
    if (dlsym(handle, #name) == NULL) return #name;
    SW_LIBPQ_FUNCTIONS(SW_LIBPQ_CHECK)
#undef SW_LIBPQ_CHECK
#define SW_LIBPQ_SET(ret, name, params)  \
    found = dlsym(handle, #name);        \
    *(void **)(&sw_##name) = found;
    SW_LIBPQ_FUNCTIONS(SW_LIBPQ_SET)
#undef SW_LIBPQ_SET
    sw_libpq_handle = handle;
    return NULL;
}

#endif
