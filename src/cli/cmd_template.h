/* cmd_template.h: `kiln template`, renders a folder's chat template. */
#ifndef KILN_CMD_TEMPLATE_H
#define KILN_CMD_TEMPLATE_H

/* argv[0] is "template". Returns the process exit code. */
int kiln_cmd_template(int argc, char **argv);

#endif
