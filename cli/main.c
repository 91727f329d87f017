#include "kiln.h"

#include <stdio.h>

int main(void)
{
    printf("kiln %s\n", kiln_version());
    return 0;
}
