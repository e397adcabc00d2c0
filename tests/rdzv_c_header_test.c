/* client/rdzv.h compiled as C99 and linked against librdzv.so from C: the header has no C++ in
 * it, and the library answers C callers with codes and messages. Needs no server: every call
 * here fails before any I/O. Exits 0 when every check holds, 1 with one line per failed check. */
#include <stdio.h>
#include <string.h>

#include "client/rdzv.h"

static int failures = 0;

static void Check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "rdzv_c_header_test: %s (last error: \"%s\")\n", what, rdzv_last_error());
    ++failures;
  }
}

int main(void) {
  rdzv_client* client = NULL;
  rdzv_join_spec spec;
  rdzv_assignment assignment;
  rdzv_code code;

  Check(strcmp(rdzv_code_name(RDZV_OK), "OK") == 0, "rdzv_code_name(RDZV_OK) is OK");
  Check(strcmp(rdzv_code_name(RDZV_UNAUTHENTICATED), "UNAUTHENTICATED") == 0,
        "rdzv_code_name(RDZV_UNAUTHENTICATED) is UNAUTHENTICATED");
  Check(strcmp(rdzv_code_name(99), "UNKNOWN") == 0, "rdzv_code_name(99) is UNKNOWN");

  code = rdzv_client_create(NULL, 10, RDZV_AUTH_NONE, NULL, NULL, &client);
  Check(code == RDZV_INVALID_ARGUMENT, "a NULL endpoint is INVALID_ARGUMENT");
  Check(strstr(rdzv_last_error(), "endpoint") != NULL, "the message names the endpoint");
  Check(client == NULL, "no client after a failed create");

  code = rdzv_client_create("127.0.0.1:1", -1, RDZV_AUTH_NONE, NULL, NULL, &client);
  Check(code == RDZV_INVALID_ARGUMENT, "a negative join timeout is INVALID_ARGUMENT");
  Check(strstr(rdzv_last_error(), "join_timeout_s") != NULL, "the message names join_timeout_s");

  /* A client connects lazily: creating one against a closed port succeeds. */
  code = rdzv_client_create("127.0.0.1:1", 1, RDZV_AUTH_NONE, NULL, NULL, &client);
  Check(code == RDZV_OK && client != NULL, "a client is made without I/O");
  Check(strcmp(rdzv_last_error(), "") == 0, "a call that succeeds clears the last error");

  rdzv_join_spec_init(&spec);
  Check(spec.min_nodes == 1 && spec.max_nodes == 1 && spec.node_index == -1 && spec.nproc == 1 &&
            spec.job_id == NULL && spec.master_port == 0,
        "rdzv_join_spec_init sets the defaults");
  code = rdzv_join(client, &spec, NULL, &assignment);
  Check(code == RDZV_INVALID_ARGUMENT, "a join without a job id is INVALID_ARGUMENT");
  Check(strstr(rdzv_last_error(), "job_id") != NULL, "the message names job_id");

  spec.job_id = "c";
  spec.nproc = 0;
  code = rdzv_join(client, &spec, NULL, &assignment);
  Check(code == RDZV_INVALID_ARGUMENT, "nproc 0 is INVALID_ARGUMENT");
  Check(strstr(rdzv_last_error(), "nproc") != NULL, "the message names nproc");

  code = rdzv_leave(NULL);
  Check(code == RDZV_INVALID_ARGUMENT, "rdzv_leave(NULL) is INVALID_ARGUMENT");
  Check(strstr(rdzv_last_error(), "client") != NULL, "the message names the client");

  rdzv_client_destroy(client);
  rdzv_client_destroy(NULL);
  return failures == 0 ? 0 : 1;
}
