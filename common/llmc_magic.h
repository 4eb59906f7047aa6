/* llmc_magic.h - the first int32 of each of llm.c's files, so that a reader given the wrong kind
 * names what it got: models (models/gpt2_llmc.c), token shards (readers/tokens.c) and the
 * tokenizer (readers/bpe.c) each check their own and recognise the others'.
 */
#ifndef COMMON_LLMC_MAGIC_H
#define COMMON_LLMC_MAGIC_H

#define LLMC_MODEL_MAGIC 20240326     /* gpt2_124M.bin and alike: the parameters */
#define LLMC_TOKENIZER_MAGIC 20240328 /* gpt2_tokenizer.bin: the vocabulary */
#define LLMC_TOKENS_MAGIC 20240520    /* *_train_NNNNNN.bin: token shards */

#endif /* COMMON_LLMC_MAGIC_H */
