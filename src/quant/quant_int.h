/* quant_int.h: internals of the quant module shared by its files and tests. */
#ifndef KILN_QUANT_INT_H
#define KILN_QUANT_INT_H

#include <cjson/cJSON.h>
#include <stdbool.h>

/* j as Python's json.dump(j, indent=4) writes it (object keys sorted at the
 * top level when sort_top, as mlx-lm's save_config does); malloc'ed, NULL
 * when out of memory. */
char *kq_json_dump_py(const cJSON *j, bool sort_top);

#endif
