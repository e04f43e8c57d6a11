/* The token stream an eval reads from a text file, one rule for every caller (quantctl eval
 * --text and a job's eval): the file is read whole and tokenized once with the model's
 * tokenizer, and BOS is prepended exactly when the tokenizer adds it by default
 * (tokenizer_config.json's add_bos_token, or the tokenizer.json post-processor). That is what
 * transformers' tokenizer(text) gives and what lm-eval's perplexity tasks feed the model, so
 * our numbers compare with theirs; a tokenizer that adds no BOS (SmolLM2's) gets none. */
#include <stdlib.h>

#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/model/eval.h"
#include "quant/model/tokenizer/tokenizer.h"

int qd_eval_text_tokens(const char *tokenizer_dir, const char *text_path, int32_t **ids, size_t *n, qd_err *err)
{
    *ids = NULL;
    *n = 0;
    qd_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = qd_input_read(text_path, QD_INPUT_TEXT, &text, &len, err);
    if (!rc) rc = qd_tokenizer_load(tokenizer_dir, &tok, err);
    if (!rc) rc = qd_tokenizer_encode(tok, text, len, QD_TOK_BOS_DEFAULT, ids, n, err);
    qd_tokenizer_free(tok);
    free(text);
    return rc;
}
