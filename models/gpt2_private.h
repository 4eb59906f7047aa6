/* gpt2_private.h - what gpt2.c shares with gpt2_llmc.c (llm.c's model files): the llm.c header's
 * fields. Private to models/.
 */
#ifndef GPT2_PRIVATE_H
#define GPT2_PRIVATE_H

#include "gpt2.h"
#include "llmc_magic.h"

#define GPT2_LLMC_MAGIC LLMC_MODEL_MAGIC
#define GPT2_LLMC_FP32 3 /* header version of fp32 parameters */
#define GPT2_LLMC_BF16 5 /* header version of bf16 parameters */
#define GPT2_LLMC_HEADER 256 /* int32 words */

#endif /* GPT2_PRIVATE_H */
