/*
 * cmd.h - the wick subcommands. Each takes the arguments after its name (argv[0] is the
 * subcommand name, as getopt_long expects), prints its own --help, and returns the process
 * exit status: 0 on success, 1 on a failure, 2 on a usage error. Only main() exits.
 */
#ifndef CMD_H
#define CMD_H

int cmd_convert(int argc, char **argv);  /* worker/cmd_convert.c */
int cmd_inspect(int argc, char **argv);  /* worker/cmd_inspect.c */
int cmd_tokenize(int argc, char **argv); /* worker/cmd_tokenize.c */
int cmd_generate(int argc, char **argv); /* worker/cmd_generate.c */
int cmd_logits(int argc, char **argv);   /* worker/cmd_generate.c */
int cmd_bench(int argc, char **argv);    /* worker/cmd_bench.c */
int cmd_snapshot(int argc, char **argv); /* worker/cmd_snapshot.c */
int cmd_prefetch(int argc, char **argv); /* worker/cmd_prefetch.c */

/* Parses "1,2,3" into a malloc'd array. Returns 0, or -1 with a message on stderr naming
 * what is wrong (empty list, not a number, out of int range). */
int cmd_parse_ids(const char *s, int **ids, int *n);

#endif
