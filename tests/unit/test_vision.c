/* test_vision.c — vision.h on a generated gemma3 and its generated
 * projector (thaw mkmodel --mmproj): a prompt's images become runs of
 * negative placeholders that pin the image bytes and the projector; a
 * prefix backs off to an image's start; hostile input is refused, never
 * decoded; an image is encoded and decoded into a sequence where it
 * stands. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llama.h>

#include "base/error.h"
#include "fixture_models.h"
#include "llama/vision.h"

#define N_IMAGE 16 /* mkmodel --mmproj: 64x64 pixels in 4-pixel patches, pooled 4x4 */

static char g_dir[] = "/tmp/thaw_vision_XXXXXX";
static char g_model_path[256], g_mmproj_path[256];
static struct llama_model *g_model;
static struct thaw_vision *g_v, *g_v_other; /* the same projector, another identity (other flags) */
static struct thaw_image g_jpeg;

static int read_file(const char *path, struct thaw_image *img)
{
    FILE *f = fopen(path, "rb");
    long n;

    memset(img, 0, sizeof *img);
    if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0 ||
        !(img->data = malloc((size_t)n)) || fread(img->data, 1, (size_t)n, f) != (size_t)n) {
        if (f)
            fclose(f);
        return -1;
    }
    img->len = (size_t)n;
    fclose(f);
    return 0;
}

static struct thaw_vision *open_vision(uint8_t id_byte)
{
    struct thaw_vision_params p = {g_mmproj_path, false, 2, 0, 0, false, {0}};
    struct thaw_vision *v = NULL;
    char err[256];

    memset(p.identity, id_byte, sizeof p.identity);
    if (thaw_vision_new(g_model, &p, &v, err, sizeof err) != 0)
        fprintf(stderr, "thaw_vision_new: %s\n", err);
    return v;
}

static int group_setup(void **state)
{
    (void)state;
    if (fixture_llama_open(g_dir) != 0)
        return -1;
    snprintf(g_model_path, sizeof g_model_path, "%s/g3.gguf", g_dir);
    snprintf(g_mmproj_path, sizeof g_mmproj_path, "%s/mmproj.gguf", g_dir);
    char *argv[] = {"mkmodel", "-o", g_model_path, "--arch", "gemma3", "--mmproj", g_mmproj_path};
    if (fixture_mkmodel(7, argv) != 0)
        return -1;
    g_model = llama_model_load_from_file(g_model_path, llama_model_default_params());
    if (!g_model || !(g_v = open_vision(1)) || !(g_v_other = open_vision(2)))
        return -1;
    return read_file(THAW_SOURCE_DIR "/.deps/llama.cpp/tools/mtmd/test-1.jpeg", &g_jpeg);
}

static int group_teardown(void **state)
{
    (void)state;
    free(g_jpeg.data);
    thaw_vision_free(g_v);
    thaw_vision_free(g_v_other);
    llama_model_free(g_model);
    return fixture_llama_close(g_dir);
}

/* "before <marker> after", with images[0..n) */
static int tokenize(struct thaw_vision *v, const struct thaw_image *imgs, size_t n, int n_markers,
                    llama_token **toks, int *n_toks, struct thaw_vision_prompt **vp, char *err)
{
    char text[256] = "Look: ";
    for (int i = 0; i < n_markers; i++) {
        strcat(text, thaw_vision_marker());
        strcat(text, " and ");
    }
    strcat(text, "tell me.");
    return thaw_vision_tokenize(v, text, imgs, n, toks, n_toks, vp, err, 256);
}

static void an_image_is_a_run_of_negative_placeholders(void **state)
{
    llama_token *t;
    struct thaw_vision_prompt *vp;
    char err[256];
    int n, pos, len;

    (void)state;
    assert_int_equal(tokenize(g_v, &g_jpeg, 1, 1, &t, &n, &vp, err), 0);
    assert_int_equal(thaw_vision_prompt_count(vp), 1);
    thaw_vision_prompt_span(vp, 0, &pos, &len);
    assert_int_equal(len, N_IMAGE);
    assert_true(pos > 0 && pos + len < n); /* text on both sides */
    for (int k = 0; k < n; k++)
        assert_true((t[k] < 0) == (k >= pos && k < pos + len));
    assert_int_equal(thaw_vision_prompt_at(vp, pos), 0);
    assert_int_equal(thaw_vision_prompt_at(vp, pos + 1), -1);
    /* a prefix never ends inside the image */
    assert_int_equal(thaw_vision_prompt_back_off(vp, pos), pos);
    assert_int_equal(thaw_vision_prompt_back_off(vp, pos + 1), pos);
    assert_int_equal(thaw_vision_prompt_back_off(vp, pos + len - 1), pos);
    assert_int_equal(thaw_vision_prompt_back_off(vp, pos + len), pos + len);
    assert_int_equal(thaw_vision_prompt_back_off(NULL, 7), 7);
    free(t);
    thaw_vision_prompt_free(vp);
}

static void placeholders_pin_the_bytes_and_the_projector(void **state)
{
    llama_token *a, *b, *c, *d;
    struct thaw_vision_prompt *va, *vb, *vc, *vd;
    char err[256];
    int na, nb, nc, nd, pos, len;

    (void)state;
    /* the same bytes, the same projector: the same tokens */
    assert_int_equal(tokenize(g_v, &g_jpeg, 1, 1, &a, &na, &va, err), 0);
    assert_int_equal(tokenize(g_v, &g_jpeg, 1, 1, &b, &nb, &vb, err), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    /* another projector identity: every placeholder differs */
    assert_int_equal(tokenize(g_v_other, &g_jpeg, 1, 1, &c, &nc, &vc, err), 0);
    thaw_vision_prompt_span(va, 0, &pos, &len);
    assert_int_equal(nc, na);
    assert_memory_equal(a, c, (size_t)pos * sizeof *a); /* the text before is text */
    for (int k = pos; k < pos + len; k++)
        assert_int_not_equal(a[k], c[k]);
    /* one byte changed in the image (a JPEG comment still decodes): other placeholders */
    struct thaw_image other = {malloc(g_jpeg.len), g_jpeg.len, NULL, ""};
    memcpy(other.data, g_jpeg.data, g_jpeg.len);
    other.data[g_jpeg.len - 3] ^= 0x01;
    assert_int_equal(tokenize(g_v, &other, 1, 1, &d, &nd, &vd, err), 0);
    assert_int_not_equal(a[pos], d[pos]);
    free(other.data);
    free(a);
    free(b);
    free(c);
    free(d);
    thaw_vision_prompt_free(va);
    thaw_vision_prompt_free(vb);
    thaw_vision_prompt_free(vc);
    thaw_vision_prompt_free(vd);
}

static void hostile_images_are_refused(void **state)
{
    static unsigned char garbage[] = "not an image at all";
    static unsigned char png_header[] = "\x89PNG\r\n\x1a\n\0\0\0\0\0\0\0\0";
    struct thaw_image bad[] = {
        {garbage, sizeof garbage, NULL, ""},
        {png_header, sizeof png_header, NULL, ""},
        {NULL, 0, NULL, ""},
    };
    llama_token *t = (llama_token *)1;
    struct thaw_vision_prompt *vp = (struct thaw_vision_prompt *)1;
    char err[256];
    int n = -1;

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(tokenize(g_v, &bad[i], 1, 1, &t, &n, &vp, err), THAW_EINVAL);
        assert_null(t);
        assert_null(vp);
        assert_int_equal(n, 0);
        assert_non_null(strstr(err, "image 1"));
    }
    /* markers and images must agree */
    assert_int_equal(tokenize(g_v, &g_jpeg, 1, 2, &t, &n, &vp, err), THAW_EINVAL);
    assert_int_equal(tokenize(g_v, &g_jpeg, 1, 0, &t, &n, &vp, err), THAW_EINVAL);
    assert_null(vp);
}

static void an_image_is_decoded_where_it_stands(void **state)
{
    llama_token *t;
    struct thaw_vision_prompt *vp;
    char err[256];
    int n, pos, len;

    (void)state;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    struct llama_context *ctx = llama_init_from_model(g_model, cp);
    assert_non_null(ctx);
    assert_int_equal(tokenize(g_v, &g_jpeg, 1, 1, &t, &n, &vp, err), 0);
    thaw_vision_prompt_span(vp, 0, &pos, &len);
    /* the text before it, then the image */
    struct llama_batch b = llama_batch_get_one(t, pos);
    assert_int_equal(llama_decode(ctx, b), 0);
    assert_int_equal(thaw_vision_eval(g_v, ctx, vp, 0, 0, 512), 0);
    assert_int_equal(llama_memory_seq_pos_max(llama_get_memory(ctx), 0), pos + len - 1);
    llama_free(ctx);
    free(t);
    thaw_vision_prompt_free(vp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(an_image_is_a_run_of_negative_placeholders),
        cmocka_unit_test(placeholders_pin_the_bytes_and_the_projector),
        cmocka_unit_test(hostile_images_are_refused),
        cmocka_unit_test(an_image_is_decoded_where_it_stands),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
